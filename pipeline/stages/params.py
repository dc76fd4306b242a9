"""Stage `params`: the whole params.yaml checked, before any other stage runs.

The code stage depends on this stage's one small file and every other stage on the code
stage's lists, so `dvc repro` and `dvc exp run` stop here, at the first stage, with one line,
before any other stage runs. (A stage run
alone, `dvc repro -s`, skips this check and refuses a bad value in its own section; its
outputs are `persist: true` in dvc.yaml, so DVC has not removed them.) Each section is
checked by the settings model of the stage that reads it; the rules between sections are
stated here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pipeline.bench.settings import BenchSettings
from pipeline.core.atomic import write_text
from pipeline.core.bounds import STRICT, AfterValidator, Len, Text, model_validator
from pipeline.core.params import ParamsError, dataset_names, load_params, validated
from pipeline.core.sources import read_sources
from pipeline.stages.convert.settings import ConvertSettings
from pipeline.stages.fetch.settings import FetchSettings
from pipeline.stages.shard.settings import ShardSettings
from pipeline.stages.train.settings import TrainSettings

# What the stage writes: the same text whatever the values, so a valid change of one key
# reruns this check and then only the stages that read that key.
CHECKED = "params.yaml: every section and the rules between sections checked\n"


def _names(names: list[str]) -> list[str]:
    wrong = dataset_names(names)
    if wrong:
        raise ValueError(wrong)
    return names


@dataclass(frozen=True)
class Params:
    """The whole file: the data sets, then one section per stage that has settings."""

    __pydantic_config__ = STRICT
    datasets: Annotated[list[Text], Len(1), AfterValidator(_names)]
    fetch: FetchSettings
    convert: ConvertSettings
    shard: ShardSettings
    bench: BenchSettings
    train: TrainSettings

    @model_validator(mode="after")
    def _bench_codec(self) -> Params:
        if self.bench.parquet_codec not in self.convert.codecs:
            raise ValueError(f"bench.parquet_codec {self.bench.parquet_codec!r} is not one of convert.codecs")
        return self


def validate_params(params: dict[str, Any], path: Path = Path("params.yaml")) -> dict[str, Any]:
    """`params` unchanged if every section and rule holds; else ParamsError listing every problem."""
    validated(Params, params, "", path)
    return params


def check_params(path: Path, out: Path, sources: Path = Path("sources.yaml")) -> None:
    """Validate the params file whole, and each of its data sets against `sources` (the
    fetch stage would find no files for one it lacks), then write `out`; a bad value raises
    ParamsError."""
    params = validate_params(load_params(path), path)
    known = read_sources(sources)
    unknown = [name for name in params["datasets"] if not isinstance(known.get(name), dict)]
    if unknown:
        raise ParamsError(
            f"{path}: datasets: {unknown[:3]} not in {sources} (it has {sorted(map(str, known))[:10]}): "
            f"the fetch stage would find no files for it"
        )
    write_text(Path(out), CHECKED)
