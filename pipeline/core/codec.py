"""A Parquet codec as params.yaml spells it: `name` or `name-level` (`zstd-19`).

Plain code with no import of pyarrow or polars: params.yaml is checked against it before
any stage runs, and each stage that writes Parquet turns it into its writer's options.
"""

from __future__ import annotations

from dataclasses import dataclass

CODECS = ("none", "snappy", "gzip", "brotli", "lz4", "zstd")
LEVELS = {"gzip": (1, 9), "brotli": (0, 11), "zstd": (1, 22)}  # what pyarrow accepts, checked up front


@dataclass(frozen=True)
class Codec:
    """A Parquet codec and optional level, spelled `name` or `name-level` in params."""

    name: str
    level: int | None = None

    @classmethod
    def parse(cls, spec: str) -> Codec:
        name, dash, level = str(spec).partition("-")
        if name not in CODECS:
            raise ValueError(f"unknown codec {spec!r}; expected one of {CODECS}, optionally -<level>")
        # one spelling per codec: it names the codec's folder and figures ('zstd-03' is not 'zstd-3')
        if dash and not (level.isascii() and level.isdigit() and level == str(int(level))):
            raise ValueError(f"codec {spec!r}: the level after '-' must be an integer without leading zeros")
        if level and name in ("none", "snappy", "lz4"):
            raise ValueError(f"codec {spec!r}: {name} takes no level")
        if level and not LEVELS[name][0] <= int(level) <= LEVELS[name][1]:
            raise ValueError(f"codec {spec!r}: {name} levels are {LEVELS[name][0]}..{LEVELS[name][1]}")
        return cls(name, int(level) if level else None)

    @property
    def label(self) -> str:
        return self.name if self.level is None else f"{self.name}-{self.level}"

    def writer_options(self) -> dict:
        return {"compression": self.name, "compression_level": self.level}

    def polars_options(self) -> dict:
        return {"compression": "uncompressed" if self.name == "none" else self.name, "compression_level": self.level}
