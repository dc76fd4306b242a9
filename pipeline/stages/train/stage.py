"""Training under torchrun: DistributedDataParallel over shards streamed per rank.

    torchrun --standalone --nproc-per-node 2 -m pipeline train mnist --shards data/shards/mnist --out metrics/train/mnist.json

The global batch is the write-up's, split evenly across ranks, so the learning rate stays
the write-up's; each rank reads its run of the epoch's order (`pipeline.shards.order`).
`--shards` may be a URL, `--checkpoint`/`--resume` continue mid-epoch with another number
of ranks too (docs/scale.md). A run's settings are one `TrainRun`; a test passes
`after_step` to act between steps (tests/train_killing_rank.py kills a rank there).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from pipeline.bench.model import MODEL_INPUT, SimpleCNN
from pipeline.core.atomic import check_replaceable, write_json
from pipeline.core.bounded import read_json
from pipeline.core.errors import InputError, reason
from pipeline.core.location import is_url
from pipeline.shards.dataset import ShardDataset, ShardLoader
from pipeline.shards.remote import join
from pipeline.shards.watched import Deadlines
from pipeline.stages.train.checkpoints import LATER, Checkpoints
from pipeline.stages.train.settings import TrainSettings


@dataclass(frozen=True)
class TrainRun:
    """One training run's settings (params.yaml's `train` section and the command's options):
    one typed value that every rank builds alike, rather than a dozen loose arguments."""

    dataset: str
    epochs: int
    global_batch: int  # samples per optimizer step, over all ranks
    lr: float
    seed: int
    record: bool = False  # also write each rank's samples and final weights
    cache: Path | None = None  # node-local folder for shards read from a URL
    cache_bytes: int = 4096 << 20
    checkpoint: Path | None = None
    checkpoint_every: int = 0  # optimizer steps; 0: at the end only
    resume: bool = False
    timeout_s: float = 300  # the most a collective may wait for the other ranks
    deadlines: Deadlines = field(default_factory=Deadlines)

    @classmethod
    def from_params(
        cls,
        dataset: str,
        params: TrainSettings,
        *,
        record: bool = False,
        cache: Path | None = None,
        checkpoint: Path | None = None,
        resume: bool = False,
    ) -> TrainRun:
        """The run of params.yaml's checked `train` section with the command's options: the
        command and the tests' launcher build it the same way."""
        remote = params.remote
        return cls(
            dataset=dataset,
            epochs=params.epochs,
            global_batch=params.batch_size,
            lr=params.lr,
            seed=params.seed,
            record=record,
            cache=cache,
            cache_bytes=params.cache_mib << 20,
            checkpoint=checkpoint,
            checkpoint_every=params.checkpoint_every,
            resume=resume,
            timeout_s=params.timeout_s,
            deadlines=Deadlines(
                connect_s=remote.connect_s,
                first_byte_s=remote.first_byte_s,
                min_rate=int(remote.min_kib_s * 1024),
                window_s=remote.window_s,
            ),
        )

    def shared(self, world_size: int) -> dict:
        """What every rank must run alike (`_agree`): the settings that change what is learnt,
        the world size and the code's digest."""
        return {
            "dataset": self.dataset,
            "epochs": self.epochs,
            "global_batch": self.global_batch,
            "lr": self.lr,
            "seed": self.seed,
            "checkpoint_every": self.checkpoint_every,
            "resume": self.resume,
            "world_size": world_size,
            "code": code_version(),
        }


def _device() -> torch.device:
    """This rank's device: GPU LOCAL_RANK where torch sees CUDA (one line when the node has
    fewer GPUs than ranks), else the CPU."""
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if local >= torch.cuda.device_count():
            raise InputError(
                f"rank {os.environ.get('RANK', '?')}: local rank {local} needs GPU {local}, this node "
                f"has {torch.cuda.device_count()}; run at most that many ranks per node "
                f"(torchrun --nproc-per-node)"
            )
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def _agree(settings: dict) -> None:
    """Every rank's run-defining settings are rank 0's, or every rank stops with one line
    naming the first key that differs and both values. Sent as JSON bytes over the process
    group (no pickle), lengths first."""
    import json

    mine = json.dumps(settings, sort_keys=True).encode()
    world = dist.get_world_size()
    lengths = [torch.zeros(1, dtype=torch.long) for _ in range(world)]
    dist.all_gather(lengths, torch.tensor([len(mine)]))
    size = int(max(lengths).item())
    padded = torch.zeros(size, dtype=torch.uint8)
    padded[: len(mine)] = torch.frombuffer(bytearray(mine), dtype=torch.uint8)
    everyone = [torch.zeros(size, dtype=torch.uint8) for _ in range(world)]
    dist.all_gather(everyone, padded)
    first = json.loads(bytes(everyone[0][: int(lengths[0])].tolist()))
    for rank, (raw, length) in enumerate(zip(everyone, lengths)):
        theirs = json.loads(bytes(raw[: int(length)].tolist()))
        for key in sorted(set(first) | set(theirs)):
            if first.get(key) != theirs.get(key):
                raise InputError(
                    f"rank {rank} runs with {key} = {theirs.get(key)!r:.80}, rank 0 with "
                    f"{first.get(key)!r:.80}; every rank must run the same settings"
                )


def train_ddp(
    shards: Path | str, out: Path, run: TrainRun, *, after_step: Callable[[int, int], None] | None = None
) -> dict | None:
    """Train SimpleCNN on `shards` (a folder or a URL) with every rank of the torchrun job;
    rank 0 returns the metrics. A collective that does not complete within `run.timeout_s`
    (another rank stopped, killed or failed) ends this rank with one line. `after_step(rank,
    global step)` runs after each optimizer step and its checkpoint: a test's hook."""
    if is_url(shards) and run.cache is None:
        raise InputError(f"--shards {shards}: a URL needs --cache, the node-local folder its shards are fetched into")
    if run.resume and run.checkpoint is None:
        raise InputError("--resume needs --checkpoint, the file to resume from")
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        raise InputError(
            "train runs under torchrun: torchrun --standalone --nproc-per-node N "
            "-m pipeline train DATASET --shards ... --out ..."
        )
    device = _device()
    from datetime import timedelta

    dist.init_process_group(BACKENDS[device.type], timeout=timedelta(seconds=run.timeout_s))
    try:
        _outputs_agreed(Path(out), run, shards)
        location = str(shards) if is_url(shards) else Path(shards)
        settings = run.shared(dist.get_world_size())
        checkpoints = Checkpoints(run.checkpoint, run.checkpoint_every, run.resume)
        with checkpoints.held():
            return _train(location, Path(out), device, run, settings, checkpoints, after_step)
    except RuntimeError as err:  # (torch's DistBackendError is one)
        line = _lost_rank(err, run.timeout_s)
        if line is None:
            raise
        raise InputError(line) from None
    finally:
        dist.destroy_process_group()


# The process group's backends: on CUDA, nccl carries the tensors on the GPU and gloo the
# small CPU messages the ranks agree with (nccl takes CUDA tensors only).
BACKENDS = {"cpu": "gloo", "cuda": "cpu:gloo,cuda:nccl"}


def _outputs_agreed(out: Path, run: TrainRun, shards: Path | str) -> None:
    """Before any work, each rank checks what it will write (rank 0 the metrics and the
    checkpoint, every rank its record with --record); one refusal stops every rank, each
    with one line, so a mistyped path costs no training on any node."""
    rank = dist.get_rank()
    problem = ""
    try:
        if rank == 0:
            _check_outputs(out, run.checkpoint, run.cache, run.resume, shards)
        if run.record:
            _check_file(out.with_name(f"{out.stem}.rank{rank}.json"), "--record's file")
    except InputError as err:
        problem = str(err)
    flag = torch.tensor([1 if problem else 0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if problem:
        raise InputError(problem)
    if int(flag.item()):
        raise InputError(f"rank {rank}: another rank refused an output of this run (its own line says which)")


def _check_outputs(out: Path, checkpoint: Path | None, cache: Path | None, resume: bool, shards: Path | str) -> None:
    """`out` and the checkpoint are neither one file nor inside the data (the shards folder,
    a URL's cache), `out` replaces only a train metrics file and the checkpoint, unless it is
    resumed from, only a train checkpoint; else one line (the run's inputs are never replaced)."""
    inside = [p.resolve() for p in (None if is_url(shards) else Path(shards), cache) if p is not None]
    for flag, path in (("--out", out), ("--checkpoint", checkpoint)):
        if path is not None and any(path.resolve().is_relative_to(folder) for folder in inside):
            raise InputError(f"{flag} {path} is inside the data (--shards or --cache): write it elsewhere")
    if checkpoint is not None and out.resolve() == checkpoint.resolve():
        raise InputError(f"--out {out} is the --checkpoint file: give the metrics a file of their own")
    _check_file(out, "--out", _is_metrics)
    if checkpoint is not None:  # resumed from, it is loaded and checked whole before any step
        _check_file(checkpoint, "--checkpoint", None if resume else _is_checkpoint)


def _check_file(path: Path, flag: str, ours: Callable[[Path], bool] | None = None) -> None:
    """`path` may be written: absent, or a regular file that `ours` says this stage wrote,
    and its folder is one or can be made (nothing is made here)."""
    check_replaceable(path)  # a folder, a device, a pipe: as any file output
    if ours is not None and path.is_file() and not ours(path):
        raise InputError(f"{path}: exists and is not what {flag} writes; refusing to replace it")
    folder = path.absolute().parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise InputError(f"{flag} {path}: a file stands where its folder goes")


def _is_metrics(path: Path) -> bool:
    """A train metrics document: a JSON object with its keys."""
    try:
        held = read_json(path, what="train metrics file")
    except InputError:
        return False
    return isinstance(held, dict) and {"world_size", "epochs"} <= set(held)


def _is_checkpoint(path: Path) -> bool:
    """A file torch.save wrote: a zip archive."""
    with path.open("rb") as file:
        return file.read(4) == b"PK\x03\x04"


def _lost_rank(err: RuntimeError, timeout_s: float) -> str | None:
    """The one line for a collective that failed because another rank stopped, failed or was
    killed (torch's error then says nothing of which or why), or None for any other error."""
    if isinstance(err, dist.DistBackendError):
        return (
            f"rank {dist.get_rank()}: a collective did not complete within train.timeout_s ({timeout_s:g} s): "
            f"another rank stopped or failed"
        )
    text = str(err)
    if "timed out" in text.lower():
        return (
            f"rank {dist.get_rank()}: a collective waited past train.timeout_s ({timeout_s:g} s): "
            f"another rank stopped or failed"
        )
    if "Connection closed by peer" in text or "Connection reset" in text:
        return f"rank {dist.get_rank()}: another rank's connection closed: it stopped or failed (its own line says why)"
    return None


def code_version() -> str:
    """The sha256 of the training code this rank runs (this stage's folder, the model, the
    shard library): ranks running other code are refused like ranks with other settings."""
    import hashlib

    import pipeline.bench.model as model
    import pipeline.shards as shards

    digest = hashlib.sha256()
    files = [
        *sorted(Path(__file__).parent.glob("*.py")),
        Path(model.__file__),
        *sorted(Path(shards.__file__).parent.glob("*.py")),
    ]
    for file in files:
        digest.update(file.name.encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()[:16]


def _loaders(shards: Path | str, run: TrainRun, batch: int) -> tuple[ShardLoader, ShardLoader]:
    """This rank's train loader (the shards in a seeded order, samples shuffled within each)
    and test loader (in order), both checked to hold the run's data set's splits."""
    rank, world = dist.get_rank(), dist.get_world_size()
    where = {
        "cache": run.cache,
        "cache_bytes": run.cache_bytes,
        "transform": list(MODEL_INPUT),
        "dataset": run.dataset,
        "deadlines": run.deadlines,
    }
    train_set = ShardDataset(_split(shards, "train"), split="train", **where)
    test_set = ShardDataset(_split(shards, "test"), split="test", **where)
    for name, split in (("train", train_set), ("test", test_set)):  # a URL's too (check_world: a folder's)
        check_fed(_split(shards, name), len(split), world)
    return (
        train_set.loader(batch, shuffle="shards", seed=run.seed, rank=rank, world_size=world),
        test_set.loader(batch, rank=rank, world_size=world),
    )


def check_fed(where: Path | str, count: int, world: int) -> None:
    """A split of `count` samples gives each of `world` ranks at least one, or one line:
    fewer leaves a rank nothing to test on (a division by zero after a whole epoch)."""
    if count < world:
        raise InputError(
            f"{where}: {count:,} samples, fewer than the {world:,} ranks (WORLD_SIZE); run fewer ranks "
            f"(torchrun --nproc-per-node)"
        )


def _loader_identity(loader: ShardLoader) -> dict:
    """What a split is, for a checkpoint and for the ranks to agree on: its data set, split,
    count and the digest of its shards' digests."""
    import hashlib

    manifest = loader.dataset.split.manifest
    digest = hashlib.sha256("".join(entry["sha256"] for entry in manifest["shards"]).encode()).hexdigest()[:16]
    return {"dataset": manifest["dataset"], "split": manifest["split"], "count": manifest["count"], "shards": digest}


@dataclass
class _Training:
    """A rank's model, optimizer, loaders and progress: the one value that restoring, each
    epoch and the records read and advance, so each is a function of its own."""

    model: SimpleCNN
    optimizer: torch.optim.Optimizer
    train: ShardLoader
    test: ShardLoader
    device: torch.device
    origin: dict  # what a checkpoint must have been saved with (not the world size: elastic)
    history: list[dict] = field(default_factory=list)
    loss_so_far: float = 0.0  # resumed mid-epoch: the epoch's loss before the checkpoint
    global_step: int = 0
    resumed: dict | None = None  # where this run took over from a checkpoint: {epoch, sample, global_step}
    batches: list[list[int]] = field(default_factory=list)  # with --record: [global step, sample ids...] of each batch
    seen: list[int] = field(default_factory=list)  # with --record: epoch 1's samples of this rank, in order

    def snapshot(self, loss_sum: torch.Tensor) -> dict:
        """A checkpoint's content, with the epoch's loss so far summed over all ranks (each
        rank's part differs, so every rank takes part)."""
        total = loss_sum.clone()
        dist.all_reduce(total)
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "data": self.train.state_dict(),
            "history": self.history,
            "loss_so_far": total.item() / dist.get_world_size(),
            "global_step": self.global_step,
            "run": self.origin,
        }


def _train(
    shards: Path | str,
    out: Path,
    device: torch.device,
    run: TrainRun,
    settings: dict,
    checkpoints: Checkpoints,
    after_step: Callable[[int, int], None] | None,
) -> dict | None:
    """Every epoch of the run from a fresh start or the checkpoint, then the records and, on
    rank 0, the metrics: the ranks first agree on `settings` and the data."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if run.global_batch % world:
        raise InputError(
            f"train.batch_size {run.global_batch} does not split evenly across the {world} ranks torchrun "
            f"started; run a number of ranks that divides it"
        )
    local_batch = run.global_batch // world
    state = _start(shards, device, run, local_batch)
    _agree({**settings, "train": state.origin["train"], "test": state.origin["test"]})
    _restore(state, checkpoints, run.epochs)
    _agree({"checkpoint position": state.resumed})  # a checkpoint some node cannot see: a fresh start there
    ddp = torch.nn.parallel.DistributedDataParallel(state.model)  # (after the load: DDP broadcasts rank 0's weights)
    while state.train.epoch < run.epochs:
        _epoch(state, ddp, run, checkpoints, after_step)
    if run.record:
        _write_record(state, out)
    return _write_metrics(state, out, run, local_batch) if rank == 0 else None


def _start(shards: Path | str, device: torch.device, run: TrainRun, local_batch: int) -> _Training:
    """A rank's fresh model, optimizer and loaders; the seed first, so every rank starts from
    the same weights (DDP also broadcasts rank 0's)."""
    torch.manual_seed(run.seed)
    model = SimpleCNN().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=run.lr)
    train, test = _loaders(shards, run, local_batch)
    origin = {
        "dataset": run.dataset,
        "train": _loader_identity(train),
        "test": _loader_identity(test),
        "seed": run.seed,
        "lr": run.lr,
        "global_batch": run.global_batch,
    }
    return _Training(model, optimizer, train, test, device, origin)


OPTIMIZER_SETTINGS = ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize")


def _taken(loader: ShardLoader) -> int:
    """Samples of the loader's current epoch already taken: by an earlier run, for a loader
    restored from a checkpoint mid-epoch; 0 at an epoch's start."""
    return len(loader.dataset) - sum(b - a for a, b in loader.state_dict()["due"])


def _optimizer_settings(optimizer: torch.optim.Optimizer) -> list[dict]:
    """Each parameter group's hyper-parameters that change what it learns: what a
    checkpoint's optimizer must share with this run's, or it would train at another rate
    than it reports. (Not torch's execution flags, which another version may add.)"""
    return [{key: group.get(key) for key in OPTIMIZER_SETTINGS} for group in optimizer.param_groups]


def _restore(state: _Training, checkpoints: Checkpoints, run_epochs: int) -> None:
    """With --resume and a checkpoint on disk, its weights, optimizer, data position and
    progress, once it is checked to be this run's; a checkpoint that does not fit is one line."""
    saved = checkpoints.load(state.device)
    if saved is None:
        return
    checkpoints.check(saved, state.origin)
    settings = _optimizer_settings(state.optimizer)  # this run's: lr, betas, eps, ...
    try:
        state.model.load_state_dict(saved["model"])
        state.optimizer.load_state_dict(saved["optimizer"])
        if _optimizer_settings(state.optimizer) != settings:  # loading puts the saved groups' values in
            raise InputError(
                f"its optimizer was saved with {_optimizer_settings(state.optimizer)!r:.200}, this run's is "
                f"{settings!r:.200}; resume only the run that saved it"
            )
        state.train.load_state_dict(saved["data"])
        state.history, state.loss_so_far, state.global_step = (
            [{**epoch, **{key: epoch.get(key) for key in LATER}} for epoch in saved["history"]],
            float(saved["loss_so_far"]),
            int(saved["global_step"]),
        )
    except InputError as err:
        raise InputError(f"{checkpoints.path}: {err}") from None
    except (RuntimeError, ValueError, KeyError, TypeError) as err:  # weights of another model, a bad state
        raise InputError(f"{checkpoints.path}: does not fit this model and optimizer ({reason(err)})") from None
    if state.train.epoch > run_epochs:  # its metrics would hold more epochs than the run asks for
        raise InputError(
            f"{checkpoints.path}: already {state.train.epoch} epochs in, past train.epochs ({run_epochs}); "
            f"raise train.epochs to train on, or leave --resume out to start afresh"
        )
    train, world = state.train, dist.get_world_size()
    done = _taken(train)
    state.resumed = {"epoch": train.epoch + 1, "sample": done, "global_step": state.global_step}
    if dist.get_rank() == 0:
        print(
            f"train: resumed from {checkpoints.path} at epoch {train.epoch + 1}, sample {done} of the epoch, "
            f"on {world} rank{'s' if world > 1 else ''}",
            file=sys.stderr,
            flush=True,
        )


def _epoch(
    state: _Training,
    ddp: torch.nn.Module,
    run: TrainRun,
    checkpoints: Checkpoints,
    after_step: Callable[[int, int], None] | None,
) -> None:
    """One epoch, or the rest of one resumed mid-epoch: its steps (a checkpoint when one is
    due), then its test and figures in the history, and the epoch's checkpoint."""
    train, rank, world = state.train, dist.get_rank(), dist.get_world_size()
    epoch, start = train.epoch, time.perf_counter()
    plan_due = [tuple(i) for i in train.state_dict()["due"]]
    steps = len(train)
    # Summed on the device (no sync per step): the ranks' sums add up to `world` times the sum of the
    # steps' global-batch means. Resumed mid-epoch, each rank starts from the saved sum of means.
    before = _taken(train)  # of this epoch, trained before this run took over
    loss_sum = torch.full((), state.loss_so_far if before else 0.0, device=state.device, dtype=torch.float64)
    state.loss_so_far = 0.0
    read_before, read_seconds = _fetched(train), 0.0
    for step, (images, labels) in enumerate(train):
        if not read_seconds:  # this epoch's first batch read (and its shards fetched)
            read_seconds = time.perf_counter() - start
        loss_sum += _step(state, ddp, images, labels, world / train.sampler.batch_total(plan_due, step))
        state.global_step += 1
        if run.record:
            state.batches.append([state.global_step, *train.indices.tolist()])
            if epoch == 0:
                state.seen += train.indices.tolist()
        if train.taken < steps and checkpoints.due(state.global_step):
            checkpoints.save(state.snapshot(loss_sum))
        if after_step is not None:
            after_step(rank, state.global_step)
    total = loss_sum.clone()
    dist.all_reduce(total)
    correct = _evaluate(state)
    full_steps = train.sampler.steps([(0, len(train.dataset))])
    state.history.append(
        {
            "epoch": epoch + 1,
            "loss": round(total.item() / world / max(full_steps, 1), 5),
            "accuracy": round(correct / len(state.test.dataset), 4),
            "steps": full_steps,
            "seconds": round(time.perf_counter() - start, 3),
            "read_seconds": round(read_seconds, 3),
            "fetched_bytes": _fetched(train) - read_before,
            "world_size": world,
            "resumed_at_sample": before,
        }
    )
    if checkpoints.due(state.global_step) or checkpoints.path and train.epoch == run.epochs:
        loss_sum.zero_()  # (the epoch's loss is in the history now)
        checkpoints.save(state.snapshot(loss_sum))
    if rank == 0:
        print(f"train epoch {epoch + 1}/{run.epochs}: {state.history[-1]}", file=sys.stderr, flush=True)


def _step(
    state: _Training, ddp: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor, scale: float
) -> torch.Tensor:
    """One optimizer step on this rank's batch; its loss, detached. `scale` is the world size
    over the samples all ranks take this step: DDP averages the ranks' gradients, so each
    rank's summed loss times it makes the update the global batch's mean (the last step's
    global batch may be smaller, and a rank's batch may even be empty)."""
    images, labels = images.to(state.device), labels.to(state.device)
    loss = F.cross_entropy(ddp(images), labels, reduction="sum") * scale
    state.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    state.optimizer.step()
    return loss.detach()


def _evaluate(state: _Training) -> int:
    """The test split's correct predictions over all ranks: each rank scores its cut of the
    split, and the counts are summed."""
    correct = torch.zeros((), device=state.device, dtype=torch.long)
    with torch.inference_mode():
        for x, y in state.test:
            correct += (state.model(x.to(state.device)).argmax(1) == y.to(state.device)).sum()
    dist.all_reduce(correct)
    return correct.item()


def _write_record(state: _Training, out: Path) -> None:
    """With --record, `<out>.rank<N>.json`: this rank's batches, epoch 1's samples, final
    weights and shard fetches, so the tests can check what each rank did."""
    rank = dist.get_rank()
    params = torch.cat([p.detach().flatten().cpu() for p in state.model.parameters()])
    fetched = {
        name: loader.dataset.split.remote.counts.as_dict()
        for name, loader in (("train", state.train), ("test", state.test))
        if loader.dataset.split.remote
    }
    write_json(
        out.with_name(f"{out.stem}.rank{rank}.json"),
        {
            "rank": rank,
            "steps": [h["steps"] for h in state.history],
            "params_sum": float(params.double().sum()),
            "params_head": params[:8].tolist(),
            "params_sha256": _params_digest(params),
            "batches": state.batches,
            "ids": state.seen,
            "fetched": fetched,
            "epochs": state.history,
        },
        indent=None,
    )


def _write_metrics(state: _Training, out: Path, run: TrainRun, local_batch: int) -> dict:
    """Rank 0's metrics (the run's shape and each epoch's figures), written to `out` and
    returned. `world_size` and the batches are this run's; a run resumed from a checkpoint
    says where it took over (`resumed`), and each epoch which ranks trained it."""
    document = {
        "world_size": dist.get_world_size(),
        "resumed": state.resumed,
        "backend": dist.get_backend(),
        "device": str(state.device),
        "global_batch": run.global_batch,
        "local_batch": local_batch,
        "lr": run.lr,
        "seed": run.seed,
        "epochs": state.history,
    }
    write_json(out, document)
    _remove_other_records(out, dist.get_world_size() if run.record else 0)
    return document


RECORD_CAP = 1 << 26  # a rank record holds its batches' sample ids: a few MB for MNIST


def _remove_other_records(out: Path, ranks: int) -> None:
    """The rank records (`<out>.rank<k>.json`, --record) beside `out` that this run did not
    write (rank `ranks` and above): an earlier run's, on more ranks, would read as this one's.
    A file of that name that is not a rank record is left as it is."""
    for path in out.parent.glob(f"{out.stem}.rank*.json"):
        rank = path.name[len(out.stem) + len(".rank") : -len(".json")]
        if not rank.isdigit() or int(rank) < ranks:
            continue
        try:
            held = read_json(path, cap=RECORD_CAP, what="rank record")
        except (InputError, OSError):
            continue
        if isinstance(held, dict) and held.get("rank") == int(rank) and "params_sha256" in held:
            path.unlink()


def _split(shards: Path | str, name: str) -> Path | str:
    return join(shards, name) if isinstance(shards, str) else shards / name


def _fetched(loader: ShardLoader) -> int:
    remote = loader.dataset.split.remote
    return remote.counts.bytes if remote else 0


def _params_digest(params: torch.Tensor) -> str:
    import hashlib

    return hashlib.sha256(params.numpy().tobytes()).hexdigest()
