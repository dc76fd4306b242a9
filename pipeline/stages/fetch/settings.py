"""params.yaml's `fetch` section, as the fetch stage reads it: its model, checked before the
stage starts and by the `params` stage before any stage runs."""

from __future__ import annotations

from pydantic import Field, StrictInt, model_validator

from pipeline.core.strict import Number, Strict


class FetchParams(Strict):
    """Timeouts, retries and the deadline of one file's download from one mirror."""

    timeout_s: Number = Field(gt=0, le=600)  # per connect and per read
    retries: StrictInt = Field(ge=0, le=10)
    backoff_s: Number = Field(ge=0, le=600)  # first pause, doubling
    deadline_s: Number = Field(gt=0, le=3600)  # the most one file may take from one mirror, all tries

    @model_validator(mode="after")
    def _fits_deadline(self) -> FetchParams:
        pauses = self.backoff_s * ((1 << self.retries) - 1)
        if pauses > self.deadline_s:
            raise ValueError(
                f"the pauses between retries (backoff_s x (2^retries - 1) = {pauses:g} s) "
                f"exceed deadline_s ({self.deadline_s:g} s)"
            )
        if self.timeout_s > self.deadline_s:
            raise ValueError(f"timeout_s ({self.timeout_s:g} s) exceeds deadline_s ({self.deadline_s:g} s)")
        return self
