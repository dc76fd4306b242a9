"""params.yaml's `convert` section: the codecs each data set is converted with, the row
groups, the codec and layout under study, and the engine that runs it (local or Ray). The
convert stage reads it, and so do the stages that gather or quote its files (codecs, summary)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Annotated, Literal

from pipeline.core.bounds import STRICT, AfterValidator, Int, Len, Text, model_validator
from pipeline.core.codec import Codec
from pipeline.stages.engine_settings import Engine


def _distinct_codecs(codecs: list[str]) -> list[str]:
    """Each spec a codec (the ValueError names it), none listed twice."""
    labels = [Codec.parse(spec).label for spec in codecs]
    if len(set(labels)) != len(labels):  # (counted once each: linear in the list's length)
        twice = sorted(label for label, n in Counter(labels).items() if n > 1)
        raise ValueError(f"codecs listed twice: {twice[:5]}{' ...' if len(twice) > 5 else ''}")
    return codecs


@dataclass(frozen=True)
class ConvertSettings:
    """One convert stage per codec; `codec` and `layout` pick the file the shard stage reads."""

    __pydantic_config__ = STRICT
    codecs: Annotated[list[Text], Len(1), AfterValidator(_distinct_codecs)]
    # Below 1,024 rows a group, the wide layout's 785 column chunks per group outweigh the
    # data (1 row: 189 MB for 1,000 rows); the writer buffers one group (784 bytes a row).
    row_group_rows: Int(1024, 1 << 20)
    codec: Text
    layout: Literal["wide", "compact"]
    # local: one process; ray: the CSV parsed and checked by Ray tasks, the same Parquet bytes
    # (docs/scale.md). Not a DVC param of the stage: switching it alone reruns nothing.
    engine: Engine = "local"

    @model_validator(mode="after")
    def _codec_listed(self) -> ConvertSettings:
        if self.codec not in self.codecs:
            raise ValueError(f"codec {self.codec!r} is not one of codecs {self.codecs}")
        return self
