"""Which training recipe reaches a target accuracy soonest? Each choice over many seeds.

Trains the write-up's SimpleCNN with the `tuned` rung's runner (`compiled`'s execution for
this device type, resident data, one batch shape) under several recipes, each from `--seeds`
fresh seeds, and prints per recipe: the final test accuracy (mean, min, max over the seeds),
and the seconds from the run's start (setup included) to each target accuracy (median and
range, with how many seeds reached it). The first row is the write-up's recipe (constant
rate, Adam's default betas, the bench's batch and epochs); the recipe `bench.tuned` in
params.yaml is marked `*`. A recipe is judged by its spread: one lucky seed proves nothing.

    python benchmarks/tuned_recipe.py --mirror <folder with mnist/> [--dataset mnist] [--seeds 10]
    python benchmarks/tuned_recipe.py --shards data/shards/mnist --seeds 10 --only "bs 256"
    python benchmarks/tuned_recipe.py --shards data/shards/mnist --seeds 10 --only "*" --graph step

`--graph` sets what one CUDA graph holds (params.yaml's `bench.graph`: a whole epoch, or one
step replayed per step), so the two can be set side by side for the recipe that matters.

Builds its inputs with `pipeline.standalone` (IDX files, checked against sources.yaml) unless
`--shards` names a shard folder the pipeline already wrote, so it runs with torch alone.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.bench.datapaths import Resident  # noqa: E402
from pipeline.bench.figures import time_to_accuracy  # noqa: E402
from pipeline.bench.recipe import execution_of, recipe_config, train_config  # noqa: E402
from pipeline.bench.runners import TrainConfig, train_static  # noqa: E402
from pipeline.bench.settings import Recipe, settings_from_params  # noqa: E402
from pipeline.bench.variants import GRAPH_SCOPES  # noqa: E402
from pipeline.core.params import load_params, section  # noqa: E402


@dataclass(frozen=True)
class Choice:
    """One recipe: its name, its training config for a seed, and its epochs."""

    name: str
    recipe: Recipe | None  # None: the write-up's recipe (constant rate)
    epochs: int

    def config(self, seed: int, write_up: TrainConfig) -> TrainConfig:
        if self.recipe is None:
            return TrainConfig(batch_size=write_up.batch_size, lr=write_up.lr, seed=seed)
        return recipe_config(self.recipe, seed)


def choices(write_up_epochs: int, tuned: Recipe) -> list[Choice]:
    """The write-up's recipe, then one-cycle recipes around the starting one (params.yaml's,
    or as the recipe flags set it): batch, peak rate, schedule length, betas and label
    smoothing each moved one step from it."""

    def recipe(**change) -> Recipe:
        return dataclasses.replace(tuned, **change)

    def named(r: Recipe) -> str:
        mark = " *" if r == tuned else ""
        smoothing = f" ls {r.label_smoothing:g}" if r.label_smoothing else ""
        return f"one-cycle bs {r.batch_size} lr {r.max_lr:g} {r.epochs} ep betas {r.betas[0]:g},{r.betas[1]:g}{smoothing}{mark}"

    variants = [
        tuned,
        recipe(batch_size=tuned.batch_size // 2),
        recipe(batch_size=tuned.batch_size * 2),
        recipe(max_lr=tuned.max_lr / 2),
        recipe(max_lr=tuned.max_lr * 2),
        recipe(epochs=tuned.epochs - 1),
        recipe(betas=(0.9, 0.999)),
        recipe(label_smoothing=0.0 if tuned.label_smoothing else 0.1),
    ]
    unique = list(dict.fromkeys(r for r in variants if r.epochs >= 1))
    return [Choice(f"write-up: Adam lr const, {write_up_epochs} ep", None, write_up_epochs)] + [
        Choice(named(r), r, r.epochs) for r in unique
    ]


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def measure(
    choice: Choice,
    data: Resident,
    device: torch.device,
    execution,
    write_up: TrainConfig,
    seeds: list[int],
    targets: list[float],
) -> str:
    """One row: accuracy over the seeds and the seconds to each target."""
    accuracies, reached = [], {t: [] for t in targets}
    for seed in seeds:
        started = time.perf_counter()
        with contextlib.redirect_stderr(io.StringIO()):  # the runner's line per epoch: one row per recipe here
            timing = train_static(
                data, device, choice.config(seed, write_up), execution, epochs=choice.epochs, started=started
            )
        accuracies.append(timing.accuracy)
        for target in targets:
            seconds = time_to_accuracy(timing, target).seconds
            if seconds is not None:
                reached[target].append(seconds)
    cells = [
        f"acc mean {100 * statistics.mean(accuracies):.2f}% ({100 * min(accuracies):.2f}-{100 * max(accuracies):.2f})"
    ]
    for target in targets:
        got = reached[target]
        cells.append(f"to {100 * target:g}%: {len(got)}/{len(seeds)}" + (f" {spread(got)} s" if got else ""))
    return f"{choice.name:<48} " + " | ".join(cells)


# The recipe flags both scripts take (`--epochs 1 --label-smoothing 0.1`): each overrides that
# field of params.yaml's `bench.tuned`.
RECIPE_FLAGS = {"epochs": int, "batch_size": int, "max_lr": float, "pct_start": float, "label_smoothing": float}


def add_recipe_flags(parser: argparse.ArgumentParser) -> None:
    for name, kind in RECIPE_FLAGS.items():
        parser.add_argument(
            f"--{name.replace('_', '-')}", type=kind, help=f"bench.tuned.{name}; default: params.yaml's"
        )


def recipe_flags(args: argparse.Namespace) -> list[str]:
    """The recipe flags as given, to hand on to another process."""
    return [
        f"--{name.replace('_', '-')}={getattr(args, name)}" for name in RECIPE_FLAGS if getattr(args, name) is not None
    ]


def with_recipe_flags(settings, args: argparse.Namespace):
    """`settings` with its tuned recipe's fields set by the recipe flags given (checked as
    params.yaml's would be, where pydantic is installed)."""
    changes = {name: getattr(args, name) for name in RECIPE_FLAGS if getattr(args, name) is not None}
    if not changes:
        return settings
    recipe = dataclasses.replace(settings.tuned, **changes)
    try:
        import pydantic  # noqa: F401
    except ImportError:
        return dataclasses.replace(settings, tuned=recipe)  # torch alone here: unchecked, as the bench's
    from pipeline.core.params import ParamsError, validated

    try:
        recipe = validated(Recipe, dataclasses.asdict(recipe), "bench.tuned", Path("the recipe flags"))
    except ParamsError as err:
        sys.exit(str(err))
    return dataclasses.replace(settings, tuned=recipe)


def checked_settings(path: Path):
    """params.yaml's bench block, checked against its schema where pydantic is installed,
    with quick mode off: the write-up's row is its whole epochs, not quick mode's two."""
    params = load_params(path)
    try:
        from pipeline.stages.params import validate_params
    except ImportError:
        print(f"{path}: not checked against its schema (pydantic is not installed here)", file=sys.stderr)
    else:
        params = validate_params(params, path)
    return settings_from_params({**section(params, "bench"), "quick": False})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--mirror", type=Path, help="a folder with <dataset>/ IDX files: inputs built here")
    source.add_argument("--shards", type=Path, help="a shard folder the pipeline wrote (train/ and test/)")
    parser.add_argument("--dataset", default="mnist")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--work", type=Path, default=Path("/tmp/pipeline-tuned-recipe"))
    parser.add_argument("--only", nargs="*", help="substrings of the recipes to run")
    parser.add_argument("--params", default="params.yaml", help="the params file whose bench block is used")
    parser.add_argument("--graph", choices=GRAPH_SCOPES, help="what one CUDA graph holds; default: params.yaml's")
    add_recipe_flags(parser)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    settings = checked_settings(Path(args.params))
    if args.graph is not None:
        settings = dataclasses.replace(settings, graph=args.graph)
    if settings.tuned is None:
        parser.error(f"{args.params}: bench.tuned is not set: no recipe to start from")
    settings = with_recipe_flags(settings, args)
    if args.shards is not None:
        shards = args.shards
    else:
        from pipeline.standalone import build_inputs

        _, shards = build_inputs(args.dataset, args.mirror, args.work, Path("sources.yaml"), 32768, None)
    data = Resident.load(shards, device, args.dataset)
    execution = execution_of(settings, "tuned", device)
    targets = list(settings.targets(args.dataset))
    seeds = list(range(settings.seed + 1, settings.seed + 1 + args.seeds))
    print(
        f"{args.dataset} on {device.type} ({torch.get_num_threads()} threads), {execution}; "
        f"seeds {seeds[0]}-{seeds[-1]}; medians (range) over the seeds that reached each target",
        flush=True,
    )
    for choice in choices(settings.epochs, settings.tuned):
        if args.only and not any(part in choice.name for part in args.only):
            continue
        print(measure(choice, data, device, execution, train_config(settings), seeds, targets), flush=True)


if __name__ == "__main__":
    main()
