"""params.yaml's `convert` section: the codecs each data set is converted with, the row
groups, the codec and layout under study, and the engine that runs it (local or Ray). The
convert stage reads it, and so do the stages that gather or quote its files (codecs, summary)."""

from __future__ import annotations

from collections import Counter
from typing import Literal

from pydantic import Field, StrictInt, StrictStr, field_validator, model_validator

from pipeline.core.codec import Codec
from pipeline.core.strict import Strict
from pipeline.stages.engine_settings import Engine


class ConvertParams(Strict):
    """One convert stage per codec; `codec` and `layout` pick the file the shard stage reads."""

    codecs: list[StrictStr] = Field(min_length=1)
    # Below 1,024 rows a group, the wide layout's 785 column chunks per group outweigh the
    # data (1 row: 189 MB for 1,000 rows); the writer buffers one group (784 bytes a row).
    row_group_rows: StrictInt = Field(ge=1024, le=1 << 20)
    codec: StrictStr
    layout: Literal["wide", "compact"]
    # local: one process; ray: the CSV parsed and checked by Ray tasks, the same Parquet bytes
    # (docs/scale.md). Not a DVC param of the stage: switching it alone reruns nothing.
    engine: Engine = "local"

    @field_validator("codecs")
    @classmethod
    def _codecs(cls, codecs: list[str]) -> list[str]:
        labels = [Codec.parse(spec).label for spec in codecs]  # ValueError names the spec
        if len(set(labels)) != len(labels):  # (counted once each: linear in the list's length)
            twice = sorted(label for label, n in Counter(labels).items() if n > 1)
            raise ValueError(f"codecs listed twice: {twice[:5]}{' ...' if len(twice) > 5 else ''}")
        return codecs

    @model_validator(mode="after")
    def _codec_listed(self) -> ConvertParams:
        if self.codec not in self.codecs:
            raise ValueError(f"codec {self.codec!r} is not one of codecs {self.codecs}")
        return self
