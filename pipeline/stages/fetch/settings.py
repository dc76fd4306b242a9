"""params.yaml's `fetch` section: timeouts, retries and the deadline of one file's download
from one mirror, checked before the stage starts and by the `params` stage before any stage
runs. One type for the section and for the fetcher (`fetch_dataset`), which takes these
defaults where a caller gives none."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.core.bounds import STRICT, Int, Num, model_validator


@dataclass(frozen=True)
class FetchSettings:
    """Timeouts, retries and the deadline of one file's download from one mirror."""

    __pydantic_config__ = STRICT
    timeout_s: Num(gt=0, le=600) = 30.0  # per connect and per read
    retries: Int(0, 10) = 3
    backoff_s: Num(ge=0, le=600) = 1.0  # first pause, doubling
    deadline_s: Num(gt=0, le=3600) = 600.0  # the most one file may take from one mirror, all tries

    @model_validator(mode="after")
    def _fits_deadline(self) -> FetchSettings:
        """params.yaml's rule (the fetcher itself stops a pause that would pass the deadline)."""
        pauses = self.backoff_s * ((1 << self.retries) - 1)
        if pauses > self.deadline_s:
            raise ValueError(
                f"the pauses between retries (backoff_s x (2^retries - 1) = {pauses:g} s) "
                f"exceed deadline_s ({self.deadline_s:g} s)"
            )
        if self.timeout_s > self.deadline_s:
            raise ValueError(f"timeout_s ({self.timeout_s:g} s) exceeds deadline_s ({self.deadline_s:g} s)")
        return self
