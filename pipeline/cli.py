"""`python -m pipeline <stage>`: one thin command per DVC stage.

Each command reads its own section of params.yaml (checked by its stage's settings model;
the `check-params` stage checks the whole file before any stage runs), calls the stage's
function in `pipeline.stages`, and turns bad input into one line on stderr and exit status 2.
Project modules are imported inside each command, so a command loads its stage's code alone
(tools/stage_deps.py lists that code in deps/, each stage's code dep in dvc.yaml).
"""

from __future__ import annotations

import contextlib
import functools
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def input_dir(flag: str, text: str, dest: str | None = None) -> Callable[[F], F]:
    """A required option naming an existing folder (an upstream stage's output)."""
    names = (flag, dest) if dest else (flag,)
    return click.option(*names, type=click.Path(path_type=Path, exists=True, file_okay=False), required=True, help=text)


def output_path(flag: str, text: str) -> Callable[[F], F]:
    """A required option naming what this stage writes."""
    return click.option(flag, type=click.Path(path_type=Path), required=True, help=text)


def file_option(*names: str, text: str, exists: bool = False, required: bool = False) -> Callable[[F], F]:
    """An option naming a file: a folder given there is refused at once, before any work."""
    kind = click.Path(path_type=Path, dir_okay=False, exists=exists)
    return click.option(*names, type=kind, required=required, help=text)


def shown(*names: str, **options: Any) -> Callable[[F], F]:
    """An option whose default `--help` shows."""
    return click.option(*names, show_default=True, **options)


def sources_option(text: str) -> Callable[[F], F]:
    """The data sets' pins file (sources.yaml), with what this command reads of it."""
    return shown("--sources", "sources_path", type=click.Path(path_type=Path), default=Path("sources.yaml"), help=text)


PARAMS_OPTION = shown(
    "--params",
    "params_path",
    type=click.Path(path_type=Path),
    default=Path("params.yaml"),
    help="The params file holding this stage's settings.",
)


def missing_package(top: str) -> str:
    """The one line for a package this interpreter lacks: which interpreter ran, and how to run
    the command in the project's environment instead (DVC runs `python` from PATH, so a shell
    without the project's venv on PATH runs the system's)."""
    import sys

    venv = Path(__file__).resolve().parents[1] / ".venv"
    here = Path(sys.prefix).resolve() == venv.resolve()
    fix = (
        "make setup installs every one"
        if here or not (venv / "bin" / "python").exists()
        else f"the project's environment has it: run `. {venv}/bin/activate` first, or use make"
    )
    return f"Error: this command needs the Python package '{top}', which {sys.executable} lacks ({fix})"


def stage_command(func: F) -> F:
    """Bad input, and a package missing from the environment, become one line on stderr and
    exit status 2, never a traceback (unless `--debug`); any other exception is a bug and
    keeps its traceback. A command's DATASET argument is checked first, whatever the command:
    a plain slug (it names folders and sources.yaml's entry; 'mnist\\n' is refused even where
    sources.yaml has such an entry), before anything is read or written."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from pipeline.core.errors import InputError, system_failure

        try:
            if kwargs.get("dataset") is not None:
                check_datasets([kwargs["dataset"]])
            return func(*args, **kwargs)
        except KeyboardInterrupt:  # Ctrl-C: one line, not click's "Aborted!" (every stage writes beside, then swaps)
            if click.get_current_context().find_root().params.get("debug"):
                raise
            # true of every command: each writes beside its output and swaps it in whole (train's
            # checkpoint too, at each save)
            click.echo("Stopped (Ctrl-C): every output holds its last whole version, none half-written", err=True)
            raise SystemExit(130) from None
        except ModuleNotFoundError as err:  # an environment without one of the project's packages
            if click.get_current_context().find_root().params.get("debug") or not err.name:
                raise
            top = err.name.split(".")[0]
            if top == "pipeline":
                raise
            click.echo(missing_package(top), err=True)
            raise SystemExit(2) from None
        except (InputError, OSError) as err:
            if isinstance(err, InputError):
                message = str(err)
            elif failure := system_failure(err):  # disk full, too large, read-only, forbidden
                message = str(failure)
            elif isinstance(err, (FileNotFoundError, IsADirectoryError, NotADirectoryError, FileExistsError)):
                message = f"{err.filename}: {err.strerror}"
            else:  # any other OSError is a bug
                raise
            if click.get_current_context().find_root().params.get("debug"):
                raise
            click.echo(f"Error: {message if isinstance(err, InputError) else message.splitlines()[0]}", err=True)
            raise SystemExit(2) from None

    return wrapper  # type: ignore[return-value]


def resolve_device(device: str) -> str:
    """`auto` is CUDA when this torch build sees a GPU, else the CPU. A device this machine
    does not have is an input error (one line), not a traceback from deep inside torch."""
    import torch

    from pipeline.budget import checked_device

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    checked_device(device, "--device", auto=True)
    return device


def check_datasets(datasets: list) -> None:
    """Data set names become folder names: plain slugs only (what the params schema asks)."""
    from pipeline.core.errors import InputError, is_slug

    bad = [name for name in datasets if not is_slug(name)]
    if bad:
        raise InputError(f"data set names must be plain slugs (a-z, 0-9, '-', '_'): {bad[:3]}")


def check_world(shards: Path, dataset: str) -> None:
    """Before torchrun's ranks start work: each split's manifest is DATASET's, and holds at
    least one sample per rank (fewer would leave a rank nothing to test on: a division by
    zero after a whole epoch)."""
    import os

    from pipeline.core.dataset import SPLITS
    from pipeline.core.location import is_url
    from pipeline.shards.format import read_manifest
    from pipeline.stages.train.stage import check_fed

    if is_url(shards):  # a remote split: the ranks check it once they have read its manifest
        return
    world = os.environ.get("WORLD_SIZE", "1")
    world_size = int(world) if world.isdigit() else 1
    for split in SPLITS:
        check_fed(Path(shards) / split, read_manifest(Path(shards) / split, dataset, split)["count"], world_size)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show the full traceback of an input error.")
def main(debug: bool) -> None:
    """Where does PyTorch training time go on MNIST, and how fast can the data path be?

    One command per DVC stage; `dvc repro` runs them in order (see dvc.yaml), the params
    check first. Each reads its own section of params.yaml, checked by its settings model.
    Bad input (a file, a row, a key) stops with one line naming it, and exit status 2.
    """


@main.command("check-params")
@output_path("--out", "File written once every section is valid: every other stage waits for it.")
@PARAMS_OPTION
@sources_option("The data sets there are: each one params.yaml names must have an entry.")
@stage_command
def check_params_command(out: Path, params_path: Path, sources_path: Path) -> None:
    """Check the whole params file, each section and the rules between sections, and that
    each data set it names is one sources.yaml knows.

    DVC's first stage: every other stage waits for the file it writes (through the code
    stage), so a bad value stops `dvc repro` and `dvc exp run` here, before any other stage
    runs."""
    from pipeline.stages.params import check_params

    check_params(params_path, out, sources_path)


@main.command()
@click.argument("dataset")
@output_path("--out", "Folder to fill with the verified, decompressed files (replaced whole).")
@sources_option("The pins (content sha256) and mirrors of each data set.")
@PARAMS_OPTION
@stage_command
def fetch(dataset: str, out: Path, sources_path: Path, params_path: Path) -> None:
    """Download DATASET's files from its mirrors, verified by content sha256.

    Mirrors are tried in order: $PIPELINE_MIRROR/<DATASET> first when set (a folder, a
    file:// URL or an http(s) URL), then DATASET's `mirrors` in sources.yaml. Each file is
    un-gzipped and hashed while it streams; a mismatch moves on to the next mirror.
    """
    from pipeline.core.params import read_section
    from pipeline.core.sources import known_rows
    from pipeline.stages.fetch.settings import FetchSettings
    from pipeline.stages.fetch.stage import fetch_dataset, load_sources

    settings = read_section(params_path, FetchSettings, "fetch")
    files, mirrors = load_sources(sources_path, dataset)
    fetch_dataset(dataset, files, mirrors, out, settings, rows=known_rows(sources_path, dataset))


@main.command("csv")
@click.argument("dataset", required=False)
@input_dir("--raw", "The fetch stage's folder.")
@output_path("--out", "Folder for train.csv and test.csv.")
@sources_option("The data sets' pins and row counts: the input must have DATASET's rows.")
@stage_command
def csv_command(dataset: str | None, raw: Path, out: Path, sources_path: Path) -> None:
    """Render train.csv and test.csv: header, then label + 784 pixels per row.

    With DATASET, each split must have the rows sources.yaml records for it."""
    from pipeline.core.sources import known_rows
    from pipeline.stages.csvdata import render_csvs

    render_csvs(raw, out, rows=known_rows(sources_path, dataset) if dataset else None)


@main.command()
@click.argument("dataset")
@click.argument("codec")
@input_dir("--csv", "The csv stage's folder (train.csv, test.csv).", dest="csv_dir")
@output_path("--out", "Folder for {wide,compact}/{train,test}.parquet.")
@output_path("--figures", "JSON file for the sizes and timings measured.")
@sources_option("The data sets' pins and row counts: the input must have DATASET's rows.")
@PARAMS_OPTION
@stage_command
def convert(
    dataset: str, codec: str, csv_dir: Path, out: Path, figures: Path, sources_path: Path, params_path: Path
) -> None:
    """Convert DATASET's CSVs to Parquet with CODEC (`zstd-19`: codec zstd, level 19).

    Writes both layouts: `wide` (label + pixel1..pixel784, the write-up's) and `compact`
    (label + one 784-byte image value). Malformed CSVs are rejected with file and line.
    """
    from pipeline.core.codec import Codec
    from pipeline.core.errors import InputError
    from pipeline.core.params import read_section
    from pipeline.core.sources import known_rows
    from pipeline.stages.convert.settings import ConvertSettings
    from pipeline.stages.convert.stage import convert_dataset

    try:
        Codec.parse(codec)
    except ValueError as err:
        raise InputError(f"CODEC: {err}") from None
    settings = read_section(params_path, ConvertSettings, "convert")
    # Python's own Ctrl-C handler back in place of the one polars installs when imported, which
    # loses the interrupt outside polars' own calls (pola-rs/polars#21739); the conversion
    # runs off this thread (`interruptible`), so Ctrl-C stops it at once.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    convert_dataset(
        csv_dir,
        out,
        figures,
        codec,
        settings.row_group_rows,
        rows=known_rows(sources_path, dataset),
        engine=settings.engine,
    )


@main.command()
@input_dir("--figures", "Folder of the convert stages' figures.")
@output_path("--metrics", "Metrics JSON to write.")
@output_path("--plot", "Plot data CSV to write.")
@PARAMS_OPTION
@stage_command
def codecs(figures: Path, metrics: Path, plot: Path, params_path: Path) -> None:
    """Gather every convert stage's figures into the codec size/speed table."""
    from pipeline.core.params import read_datasets, read_section
    from pipeline.stages.codecs import write_codecs
    from pipeline.stages.convert.settings import ConvertSettings

    convert = read_section(params_path, ConvertSettings, "convert")
    write_codecs(figures, read_datasets(params_path), list(convert.codecs), metrics, plot)


@main.command()
@click.argument("dataset")
@click.option(
    "--parquet",
    required=True,
    help="Folder holding train.parquet and test.parquet (either layout); "
    "with shard.engine ray, also a URL every Ray node reads (s3://bucket/parquet/mnist/zstd-3/compact).",
)
@output_path("--out", "Folder for train/ and test/ shard folders.")
@sources_option("The data sets' pins and row counts: the input must have DATASET's rows.")
@PARAMS_OPTION
@stage_command
def shard(dataset: str, parquet: str, out: Path, sources_path: Path, params_path: Path) -> None:
    """Write DATASET's Parquet as safetensors shards with a checksummed manifest.

    The samples must be DATASET's as published: their images and labels, written out as IDX
    files, must have the sha256 sources.yaml pins (a Parquet folder of another data set or
    split is refused, naming what it holds); the manifest records both digests."""
    from pipeline.core.params import read_section
    from pipeline.core.sources import known_rows
    from pipeline.stages.shard.settings import ShardSettings
    from pipeline.stages.shard.source import parquet_source, published_pins
    from pipeline.stages.shard.stage import shard_dataset

    layout = read_section(params_path, ShardSettings, "shard")
    source = parquet_source(parquet, layout.engine)
    shard_dataset(
        source,
        out,
        dataset,
        layout,
        rows=known_rows(sources_path, dataset),
        pins=published_pins(sources_path, dataset),
    )


@main.command()
@output_path("--out", "JSON file for the fingerprint (rewritten only when it changes).")
@shown("--device", default="auto", help="The device the bench will use: auto, cpu, cuda.")
@stage_command
def machine(out: Path, device: str) -> None:
    """Fingerprint this machine (CPU, cores, memory, GPU, torch, CUDA): the bench's input.

    DVC runs this on every `dvc repro`; the bench reruns only when the fingerprint changes,
    that is on another machine or another torch."""
    from pipeline.stages.machine import write_machine

    write_machine(out, device)


@main.command()
@click.argument("dataset")
@input_dir("--parquet", "Folder with the wide-layout train.parquet and test.parquet (the write-up's input).")
@input_dir("--shards", "The shard stage's folder for DATASET (train/, test/).")
@output_path("--out", "Metrics JSON to write.")
@click.option(
    "--machine",
    "machine_path",
    type=click.Path(path_type=Path),
    required=True,
    help="The machine stage's fingerprint, recorded with the results.",
)
@shown("--device", default="auto", help="Torch device: auto (cuda when available, else cpu), cpu, cuda, cuda:1, ...")
@PARAMS_OPTION
@stage_command
def bench(
    dataset: str, parquet: Path, shards: Path, out: Path, machine_path: Path, device: str, params_path: Path
) -> None:
    """Time the write-up's training ladder and the faster variants on DATASET.

    Variants, epochs, batch size and which slow variants are timed on sampled steps come
    from the `bench` block of params.yaml. Progress per variant and epoch, with the time
    left, goes to stderr; a variant whose epochs disagree is marked unstable and named in a
    warning at the end.
    """
    from pipeline.bench.settings import settings_from_params
    from pipeline.bench.stage import bench_dataset, read_machine
    from pipeline.core.params import load_params, section

    settings = settings_from_params(section(load_params(params_path), "bench"), params_path)
    bench_dataset(dataset, parquet, shards, out, resolve_device(device), settings, read_machine(machine_path))


@main.command()
@input_dir("--figures", "The convert stages' figures folder (<dataset>/<codec>.json).")
@input_dir("--bench", "Folder of the bench stages' JSON files.", dest="bench_dir")
@output_path("--out", "Headline metrics JSON to write.")
@PARAMS_OPTION
@stage_command
def summary(figures: Path, bench_dir: Path, out: Path, params_path: Path) -> None:
    """The headline figures that `dvc metrics show` / `dvc exp show` compare: per data set,
    the train Parquet MB in the codec under study and the fastest steady epoch."""
    from pipeline.core.params import read_datasets, read_section
    from pipeline.stages.convert.settings import ConvertSettings
    from pipeline.stages.summary import write_summary

    convert = read_section(params_path, ConvertSettings, "convert")
    write_summary(figures, bench_dir, read_datasets(params_path), convert.codec, convert.layout, out)


@main.command()
@input_dir("--bench", "Folder of this machine's bench metrics JSON files.", dest="bench_dir")
@click.option("--codecs", "codecs_path", type=click.Path(path_type=Path), help="The codecs metrics JSON.")
@shown(
    "--results",
    "results_dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path("results"),
    help="Committed bench results of other machines, one folder each.",
)
@file_option(
    "--readme",
    exists=True,
    text="README whose generated and embed blocks are rewritten (the prose around them is kept); "
    "left out, no README is touched (the pipeline's own run).",
)
@output_path("--page", "The results page to write whole (data/report/results.md; docs/results.md to publish).")
@output_path("--images", "Folder of the charts to write (SVG and the Vega-Lite spec of each).")
@output_path("--ladder-plot", "Ladder plot data CSV (this machine) for `dvc plots show`.")
@output_path("--budget-plot", "Time budget plot data CSV (this machine) for `dvc plots show`.")
@stage_command
def report(
    bench_dir: Path,
    codecs_path: Path | None,
    results_dir: Path,
    readme: Path | None,
    page: Path,
    images: Path,
    ladder_plot: Path,
    budget_plot: Path,
) -> None:
    """Render the results page, the charts and the plot data from metrics/ and results/ (and,
    with --readme, the README's generated blocks: `make publish`)."""
    from pipeline.stages.report.render import write_report

    write_report(
        sorted(bench_dir.glob("*.json")), codecs_path, readme, results_dir, page, images, ladder_plot, budget_plot
    )


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("script", type=click.Path(path_type=Path))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@shown(
    "--device",
    default="auto",
    help="The device the loop trains on: auto (where its optimizer's parameters are), cpu, cuda, cuda:1.",
)
@shown("--steps", type=click.IntRange(1, 100_000), default=20, help="Train steps in the profiled window.")
@shown(
    "--skip",
    type=click.IntRange(0, 1_000_000),
    default=5,
    help="Train steps run first, unprofiled (warm-up, compilation, workers starting), counted from the "
    "script's first; the first two find the loop, so the window starts at the third at the earliest.",
)
@file_option("--json", "json_path", text="Also write the budget as JSON (a metrics file `dvc metrics show` reads).")
@file_option("--trace", text="Also write the window as a Chrome/Perfetto trace, steps and parts marked.")
@file_option(
    "--ladder",
    exists=True,
    text="A bench metrics file (metrics/bench/<dataset>.json) whose rungs the verdict quotes.",
)
@click.option(
    "--keep-going",
    is_flag=True,
    help="Let the script run to its end after the window; a failing end is said after the report (exit 2).",
)
@shown(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0, min_open=True, max=7 * 24 * 3600),
    default=300,
    help="Seconds the script may run before its window is profiled; then it is stopped and what was seen said.",
)
@stage_command
def profile(
    script: Path,
    args: tuple[str, ...],
    device: str,
    steps: int,
    skip: int,
    json_path: Path | None,
    trace: Path | None,
    ladder: Path | None,
    keep_going: bool,
    timeout_s: float,
) -> None:
    """Where a training script's step time goes, without editing it: SCRIPT runs with ARGS.

    The loop is found as the first DataLoader whose batches an optimizer steps between; after
    --skip steps, --steps steps are profiled and the parts of a step (data wait, copy,
    compute, overhead, other) printed with the bound and what to try. Then the script is
    stopped, unless --keep-going. Options go before SCRIPT; everything after it is the
    script's. A script whose loop the command cannot see ends with one line saying what it
    needs (then wrap the loop in TimeBudget: docs/budget.md); one that raises shows its own
    traceback, then that line; one still short of its window after --timeout is stopped.
    """
    from pipeline.budget import ProfileError, profile_script
    from pipeline.core.atomic import atomic_path, write_json
    from pipeline.core.bounded import read_json

    quoted = None
    if ladder:  # refused in one line, not ignored: the verdict would quote nothing
        from pipeline.bench.document import BenchDoc, validate
        from pipeline.budget import LadderQuote

        document = read_json(ladder, 64 << 20, "bench metrics file")
        validate(ladder, document, BenchDoc)
        quoted = LadderQuote.of(document)
    for path, hint in ((json_path, "--json"), (trace, "--trace")):  # said now, not after the script has run
        if path and not path.resolve().parent.is_dir():
            raise click.BadParameter(f"{path}: the folder {path.parent} does not exist", param_hint=hint)
    json_path, trace = (path.resolve() if path else None for path in (json_path, trace))  # the script may chdir
    with contextlib.ExitStack() as outputs:
        # Each output's temporary is made now, beside it: a folder that cannot be written in is
        # said before the script runs, and a stop (Ctrl-C, a failure) leaves what was there.
        trace_tmp = outputs.enter_context(atomic_path(trace)) if trace else None
        json_tmp = outputs.enter_context(atomic_path(json_path)) if json_path else None
        failed = None
        try:
            result = profile_script(
                script,
                list(args),
                None if device == "auto" else resolve_device(device),
                steps,
                skip,
                str(trace_tmp) if trace_tmp else None,
                keep_going,
                timeout_s,
            )
        except ProfileError as err:
            if err.budget is None:
                raise
            result, failed = err.budget, err  # the window is whole: its budget, then the failure
        click.echo(result.report(quoted))
        if json_tmp:
            write_json(json_tmp, {"script": script.name, **result.to_json()})
    if failed is not None:
        raise failed


@main.command("standalone-bench")
@click.option(
    "--mirror",
    type=click.Path(path_type=Path, exists=True, file_okay=False),
    required=True,
    help="Folder holding <dataset>/ with the four IDX .gz files (e.g. /data/idx).",
)
@shown(
    "--out",
    "out_root",
    type=click.Path(path_type=Path),
    default=Path("results"),
    help="Results root: writes <out>/<machine>/<dataset>.json.",
)
@shown(
    "--work",
    type=click.Path(path_type=Path),
    default=Path("/tmp/pipeline-standalone"),
    help="Scratch folder for the raw files, Parquet and shards.",
)
@click.option("--dataset", "datasets", multiple=True, help="Data set(s) to run; default: params.yaml's list.")
@shown("--device", default="auto", help="auto (cuda when available), cpu, cuda, ...")
@shown("--commit", default="unknown", help="The project commit, recorded in the results.")
@click.option("--epochs", type=int, help="Override bench.epochs.")
@click.option("--sample-steps", type=int, help="Override bench.sample_steps (the slow rungs' sampled steps).")
@sources_option("The pins of each data set.")
@PARAMS_OPTION
@stage_command
def standalone_bench(
    mirror: Path,
    out_root: Path,
    work: Path,
    datasets: tuple[str, ...],
    device: str,
    commit: str,
    epochs: int | None,
    sample_steps: int | None,
    sources_path: Path,
    params_path: Path,
) -> None:
    """Run the bench from the IDX files alone, where only torch, numpy, pandas, pyarrow,
    safetensors and xxhash are installed (a GPU machine set up for training, say): no dvc,
    polars or zstandard.

    Builds the wide Parquet and the shards with pyarrow and the shard writer, checks every
    raw file against sources.yaml, runs params.yaml's bench, and writes
    results/<machine>/<dataset>.json for `make publish` to render in the README.
    """
    from pipeline.core.params import load_params, section
    from pipeline.standalone import run_standalone

    overrides = {k: v for k, v in (("epochs", epochs), ("sample_steps", sample_steps)) if v is not None}
    device = resolve_device(device)
    names = list(datasets) or list(section(load_params(params_path), "datasets"))
    check_datasets(names)
    run_standalone(mirror, out_root, work, names, params_path, sources_path, device, commit, overrides)


@main.command()
@click.argument("dataset")
@click.option(
    "--shards",
    required=True,
    help="The shard stage's folder for DATASET (train/, test/), or its URL (s3://bucket/prefix).",
)
@file_option("--out", required=True, text="Metrics JSON that rank 0 writes.")  # a folder: refused before training
@click.option(
    "--cache",
    type=click.Path(path_type=Path, file_okay=False),
    help="Node-local folder that shards read from a URL are fetched into (bound: train.cache_mib).",
)
@file_option(
    "--checkpoint",
    text="File rank 0 saves model, optimizer and data position to every train.checkpoint_every steps.",
)
@click.option("--resume", is_flag=True, help="Continue from --checkpoint when it exists (mid-epoch too).")
@click.option("--record", is_flag=True, help="Also write each rank's samples and final weights (for checks).")
@PARAMS_OPTION
@stage_command
def train(
    dataset: str,
    shards: str,
    out: Path,
    cache: Path | None,
    checkpoint: Path | None,
    resume: bool,
    record: bool,
    params_path: Path,
) -> None:
    """Train SimpleCNN on DATASET with DistributedDataParallel; run it under torchrun:

    torchrun --standalone --nproc-per-node N -m pipeline train DATASET --shards ... --out ...

    gloo on the CPU, nccl on CUDA (gloo for its small messages); the global batch (train.batch_size) is split across the N
    ranks, each reading its contiguous run of the epoch's shuffled shards. Two nodes, shards in
    S3, resumable with the same or another number of ranks: docs/scale.md.
    """
    from pipeline.core.location import is_url
    from pipeline.core.params import read_section
    from pipeline.stages.train.settings import TrainSettings
    from pipeline.stages.train.stage import TrainRun, train_ddp

    if not is_url(shards) and not Path(shards).is_dir():
        raise click.BadParameter(f"{shards} is neither a folder nor a URL", param_hint="--shards")
    if resume and not checkpoint:
        raise click.BadParameter("--resume needs --checkpoint, the file to resume from", param_hint="--resume")
    check_world(shards, dataset)
    run = TrainRun.from_params(
        dataset,
        read_section(params_path, TrainSettings, "train"),
        record=record,
        cache=cache,
        checkpoint=checkpoint,
        resume=resume,
    )
    train_ddp(shards, out, run)
