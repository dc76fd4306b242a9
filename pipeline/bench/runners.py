"""How a variant runs its training steps, and what it pays before the first one.

`train_eager` is the write-up's loop over any iterable of batches. `train_static` runs every
step at one batch shape over splits resident on the device, the last batch padded with
weight-0 samples so that loss and gradients equal the write-up's: one compilation, and an
epoch (or a step) that a CUDA graph can capture (docs/bench.md, "Static steps and padding").
Everything before the first timed step (model, compiling, capturing) is timed as setup.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

import torch
import torch.nn.functional as F

from pipeline.bench.datapaths import DataPath, Resident
from pipeline.bench.model import SimpleCNN
from pipeline.bench.profiled import profile_steps
from pipeline.bench.variants import Execution
from pipeline.budget import sync, timed_window
from pipeline.core.errors import InputError, reason
from pipeline.shards.order import ShardSampler
from pipeline.shards.transforms import unit_float

T = TypeVar("T")


@dataclass(frozen=True)
class OneCycle:
    """A one-cycle learning rate over a whole run (PyTorch's `OneCycleLR`, momentum held):
    a warm-up to `max_lr` over `pct_start` of the steps, then a cosine fall far below it.
    Why: it reaches a given accuracy in fewer epochs than a constant rate, and a run of fixed
    length is what the `tuned` rung is timed over."""

    max_lr: float
    pct_start: float = 0.25
    div_factor: float = 25.0
    final_div_factor: float = 1e4

    def rates(self, steps: int) -> list[float]:
        """The rate of each of `steps` optimizer steps, as `OneCycleLR` sets them."""
        param = torch.zeros(1, requires_grad=True)
        optimizer = torch.optim.SGD([param], lr=self.max_lr)
        schedule = torch.optim.lr_scheduler.OneCycleLR(
            optimizer,
            max_lr=self.max_lr,
            total_steps=max(steps, 2),
            pct_start=self.pct_start,
            div_factor=self.div_factor,
            final_div_factor=self.final_div_factor,
            cycle_momentum=False,
        )
        rates = []
        for _ in range(steps):
            rates.append(float(optimizer.param_groups[0]["lr"]))
            optimizer.step()
            schedule.step()
        return rates


@dataclass(frozen=True)
class TrainConfig:
    """What a run's training takes: the write-up's hyper-parameters by default; the `tuned`
    rung's recipe sets its own batch, Adam betas and a one-cycle schedule."""

    batch_size: int = 512
    lr: float = 1e-3
    seed: int = 42
    betas: tuple[float, float] = (0.9, 0.999)
    schedule: OneCycle | None = None  # None: the constant `lr`
    label_smoothing: float = 0.0  # the train loss's; the test pass counts correct answers only


@dataclass
class Timing:
    train_s: list[float] = field(default_factory=list)
    test_s: list[float] = field(default_factory=list)
    accuracy: float | None = None
    accuracies: list[float] = field(default_factory=list)  # the test accuracy after each timed epoch
    loss: float | None = None
    setup_s: float = 0.0  # from the variant's start to its first timed step
    warmup_s: float = 0.0  # of which: warm-up steps (compiling, autotuning)
    capture_s: float = 0.0  # of which: capturing the CUDA graphs
    cuda_graph: bool = False  # whether the epochs really replayed a CUDA graph
    budget: dict | None = None  # where a train step's time goes (`profiled.profile_steps`)
    sampled_steps: int | None = None  # train steps per timed epoch when sampled; None: whole epochs
    sampled_test_steps: int | None = None  # test steps per timed epoch when sampled


class RecompileError(InputError):
    """A compiled model compiled again during its timed epochs: its figures would include
    compiling, so the run stops (one line) rather than publish them."""


def no_recompiles(execution: Execution):
    """During the timed epochs a compiled model must not compile again (its figures would
    include compiling): torch.compiler's `fail_on_recompile` stance makes a recompile an error."""
    return (
        torch.compiler.set_stance("fail_on_recompile") if execution.compile_mode != "none" else contextlib.nullcontext()
    )


@contextlib.contextmanager
def timed_without_recompiles(execution: Execution, progress: str) -> Iterator[None]:
    """`no_recompiles`, with the error it raises turned into a RecompileError naming the run."""
    try:
        with no_recompiles(execution):
            yield
    except RuntimeError as err:
        if execution.compile_mode == "none" or "recompil" not in str(err).lower():
            raise
        raise RecompileError(
            f"{progress or 'a compiled run'}: torch.compile compiled again during the timed "
            f"epochs ({reason(err, 160)}); its figures would include compiling"
        ) from None


def build_model(
    device: torch.device, config: TrainConfig, execution: Execution, graph: bool
) -> tuple[torch.nn.Module, Callable, torch.optim.Optimizer]:
    """The model (seeded), what to call for a forward pass, and Adam; graph-safe when `graph`."""
    torch.manual_seed(config.seed)
    model = SimpleCNN().to(device)
    if execution.channels_last:
        model = model.to(memory_format=torch.channels_last)
    # fused + capturable: Adam's step count lives on the device and its update is one kernel,
    # as a CUDA graph requires; a scheduled rate is then a device tensor the graph reads. Elsewhere
    # the default (foreach) implementation, its rate a float set before each step.
    extra = {"fused": True, "capturable": True} if graph else {}
    lr = (
        torch.tensor(float(config.lr), dtype=torch.float32, device=device)
        if graph and config.schedule is not None
        else config.lr
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, betas=config.betas, **extra)
    if execution.compile_mode == "none":
        return model, model, optimizer
    # Forget what this process compiled before: each run pays its own compilation, as a
    # user's would (Inductor's on-disk cache of kernels stays, as it does for a user).
    torch.compiler.reset()
    mode = execution.compile_mode if execution.backend == "inductor" else None
    return model, torch.compile(model, mode=mode, backend=execution.backend), optimizer


def _autocast(device: torch.device, enabled: bool):
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=enabled)


def _report(progress: str, epoch: int, epochs: int, timing: Timing) -> None:
    """One line an epoch; a sampled epoch says what it timed (its steps, not the epoch) and
    reports no accuracy (the model has trained only those steps)."""
    if timing.sampled_steps is not None:
        print(
            f"  {progress} sampled epoch {epoch + 1}/{epochs}: {timing.sampled_steps} train steps "
            f"{timing.train_s[-1]:.3f} s, {timing.sampled_test_steps} test steps {timing.test_s[-1]:.3f} s "
            f"(the epoch's figures are extrapolated from these; no accuracy)",
            file=sys.stderr,
            flush=True,
        )
        return
    print(
        f"  {progress} epoch {epoch + 1}/{epochs}: train {timing.train_s[-1]:.3f} s, "
        f"test {timing.test_s[-1]:.3f} s, accuracy {timing.accuracy:.4f}",
        file=sys.stderr,
        flush=True,
    )


def clocked(device: torch.device, work: Callable[[], T]) -> tuple[T, float]:
    """What `work` returns and the seconds it took, the device synchronised before and after:
    the one clock every timed epoch (variants' and floors') is read with."""
    sync(device)
    start = time.perf_counter()
    result = work()
    sync(device)
    return result, time.perf_counter() - start


def _timed_epochs(
    timing: Timing,
    device: torch.device,
    epochs: int,
    train_epoch: Callable[[int], None],
    test_pass: Callable[[], float],
    mean_loss: Callable[[], float],
    progress: str,
    before_epoch: Callable[[int], None] = lambda epoch: None,
    until: float | None = None,
) -> None:
    """The clock both runners share: train, then test, each timed after synchronising;
    `before_epoch` runs off the clock. With `until`, the epochs stop after the first test
    pass at or above that accuracy (a time-to-accuracy run)."""
    for epoch in range(epochs):
        before_epoch(epoch)
        _, seconds = clocked(device, lambda: train_epoch(epoch))
        timing.train_s.append(seconds)
        timing.accuracy, seconds = clocked(device, test_pass)
        timing.test_s.append(seconds)
        timing.accuracies.append(timing.accuracy)
        timing.loss = mean_loss()
        _report(progress, epoch, epochs, timing)
        if until is not None and timing.accuracy >= until:
            break


# ---------------------------------------------------------------- eager: the write-up's loop


def _as_batch(item, device: torch.device, non_blocking: bool) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = (item["image"], item["label"]) if isinstance(item, dict) else item
    return x.to(device, non_blocking=non_blocking), y.to(device, non_blocking=non_blocking)


def _limited(iterable: Iterable, steps: int | None) -> Iterator:
    """The first `steps` items (all when None), never asking the loader for one more: a
    sampled epoch must not wait for a batch it does not train on."""
    return iter(iterable) if steps is None else itertools.islice(iterable, steps)


def train_eager(
    path: DataPath,
    device: torch.device,
    config: TrainConfig,
    *,
    epochs: int,
    steps: int | None = None,
    test_steps: int | None = None,
    started: float | None = None,
    progress: str = "",
    budget: int = 0,
    until: float | None = None,
) -> Timing:
    """The write-up's loop over `path`'s batches; `steps` and `test_steps` cap the train and test
    steps per epoch (sampled timing); `until` stops after the first test pass at that accuracy.
    With `budget` (a number of steps), one more epoch, from a fresh iterator, worker start-up
    included, is profiled after the timed ones (`profiled.profile_steps`): its first `budget`
    steps, or a sampled epoch's `steps` whole; the very steps the timed figures are made of."""
    started = time.perf_counter() if started is None else started
    model, forward, optimizer = build_model(device, config, Execution(), graph=False)
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=config.label_smoothing)
    non_blocking = device.type == "cuda"
    timing = Timing(sampled_steps=steps, sampled_test_steps=test_steps if steps is not None else None)
    sync(device)
    timing.setup_s = time.perf_counter() - started
    total_loss = torch.zeros((), device=device)

    def train_step(batch: tuple[torch.Tensor, torch.Tensor]) -> None:
        x, y = batch
        loss = loss_fn(forward(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        total_loss.add_(loss.detach())

    def train_epoch(epoch: int) -> None:
        total_loss.zero_()
        for item in _limited(path.train(), steps):
            train_step(_as_batch(item, device, non_blocking))

    def test_pass() -> float:
        correct, seen = torch.zeros((), device=device, dtype=torch.long), 0
        with torch.inference_mode():
            for item in _limited(path.test(), test_steps if steps is not None else None):
                x, y = _as_batch(item, device, non_blocking)
                correct += (forward(x).argmax(1) == y).sum()
                seen += len(y)
        return correct.item() / max(seen, 1)

    _timed_epochs(
        timing,
        device,
        epochs,
        train_epoch,
        test_pass,
        lambda: total_loss.item() / max(steps or path.train_steps, 1),
        progress,
        until=until,
    )
    if budget:
        profiled = steps if steps is not None else min(budget, path.train_steps)
        timing.budget = profile_steps(
            _limited(path.train(), profiled),
            lambda item: _as_batch(item, device, non_blocking),
            train_step,
            profiled,
            device,
            warmup=0,
        )
    return timing


# ---------------------------------------------------------------- static: one shape, graphable


def _padded(n: int, batch: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions < n as a mask, per-position loss weight 1/n_step) over ceil(n/batch) steps."""
    positions = torch.arange(math.ceil(n / batch) * batch, device=device)
    real = positions < n
    per_step = torch.clamp(n - (positions // batch) * batch, max=batch)
    return real, real / per_step


class StaticSteps:
    """A run at one batch shape over resident data; see the module docstring for why.

    `pregathered=True` converts each epoch's batches, in that epoch's order, before its clock
    starts: the timed epoch is then the same steps over the same data with no data path at
    all (the floor every variant with these options is compared with).

    With `execution.graph_scope == "step"` a step reads its batch, loss weights and rate at
    the position a counter on the device holds, and adds one to it: the same steps, so one
    captured step replayed `train_steps` times is the epoch (on any device: the CPU runs the
    counter's steps eagerly, which lets its tests pin down the batches it picks)."""

    def __init__(
        self,
        data: Resident,
        device: torch.device,
        config: TrainConfig,
        execution: Execution,
        pregathered: bool = False,
        epochs: int = 1,
    ) -> None:
        self.device, self.execution, self.batch = device, execution, config.batch_size
        self.label_smoothing = config.label_smoothing
        self.graph = execution.cuda_graph and device.type == "cuda"
        self.by_counter = execution.graph_scope == "step"
        self.step_index = torch.zeros(1, dtype=torch.long, device=device)  # the counter's position
        self.model, self.forward, self.optimizer = build_model(device, config, execution, self.graph)
        self.initial = [p.detach().clone() for p in self.model.parameters()]
        self.data = data
        n_train, n_test, b = len(data.train_labels), len(data.test_labels), self.batch
        self.train_steps, self.test_steps = math.ceil(n_train / b), math.ceil(n_test / b)
        self.order = torch.zeros(self.train_steps * b, dtype=torch.long, device=device)
        _, self.weights = _padded(n_train, b, device)
        self.pregathered = pregathered
        if pregathered:  # static buffers, refilled off the clock (a captured graph reads them)
            self.xs = torch.zeros((len(self.order), 1, *data.train_images.shape[1:]), device=device)
            self.ys = torch.zeros(len(self.order), dtype=torch.long, device=device)
        self.test_mask, _ = _padded(n_test, b, device)
        self.test_order = torch.arange(len(self.test_mask), device=device) * self.test_mask
        self.sampler = ShardSampler(n_train, b, shuffle=True, seed=config.seed)  # the `device` variant's order
        self.total_loss = torch.zeros((), device=device)
        self.correct = torch.zeros((), dtype=torch.long, device=device)
        self.train_graph: torch.cuda.CUDAGraph | None = None
        self.test_graph: torch.cuda.CUDAGraph | None = None
        # A scheduled rate: every step's over `epochs` epochs, and this epoch's on the device
        # (refilled off the clock, read by the step: a captured epoch replays with each epoch's).
        self.rates = (
            None
            if config.schedule is None
            else torch.tensor(config.schedule.rates(epochs * self.train_steps)).view(epochs, self.train_steps)
        )
        self.epoch_rates = None if self.rates is None else self.rates[0].to(device)
        self.epoch_rates_host: list[float] = [] if self.rates is None else self.rates[0].tolist()

    def _batch(self, images: torch.Tensor, labels: torch.Tensor, order: torch.Tensor, step: int):
        index = order[step * self.batch : (step + 1) * self.batch]
        return unit_float(images[index], add_channel=True), labels[index].long()

    def _at_counter(self, values: torch.Tensor) -> torch.Tensor:
        """Step `step_index`'s rows of a tensor laid out step after step (`train_steps` steps)."""
        return values.view(self.train_steps, -1, *values.shape[1:]).index_select(0, self.step_index)[0]

    def _gather(self, step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A train step's batch: gathered and converted, or (pregathered) a view; with a
        counter, step `step_index`'s rather than `step`'s."""
        if self.by_counter:
            weights = self._at_counter(self.weights)
            if self.pregathered:
                return self._at_counter(self.xs), self._at_counter(self.ys), weights
            index = self._at_counter(self.order)
            return (
                unit_float(self.data.train_images[index], add_channel=True),
                self.data.train_labels[index].long(),
                weights,
            )
        weights = self.weights[step * self.batch : (step + 1) * self.batch]
        if self.pregathered:
            window = slice(step * self.batch, (step + 1) * self.batch)
            return self.xs[window], self.ys[window], weights
        x, y = self._batch(self.data.train_images, self.data.train_labels, self.order, step)
        return x, y, weights

    def train_step(self, step: int) -> None:
        """One train step on batch `step` of the epoch's order (what benchmarks time alone)."""
        self._seek(step)
        self._step(step)

    def _step(self, step: int) -> None:
        """Step `step` of an epoch; with a counter, the counter's step, and the counter moves on."""
        self._set_rate(step)
        self._update(*self._gather(step))
        if self.by_counter:
            self.step_index += 1

    def _set_rate(self, step: int) -> None:
        """The scheduled rate of this step of the epoch: copied on the device under a graph
        (the captured step reads the tensor), set as a float otherwise."""
        if self.rates is None:
            return
        group = self.optimizer.param_groups[0]
        if torch.is_tensor(group["lr"]):
            group["lr"].copy_(self._at_counter(self.epoch_rates)[0] if self.by_counter else self.epoch_rates[step])
        else:
            group["lr"] = self.epoch_rates_host[step]

    def _update(self, x: torch.Tensor, y: torch.Tensor, weights: torch.Tensor) -> None:
        with _autocast(self.device, self.execution.autocast):
            logits = self.forward(x)
        loss = F.cross_entropy(logits.float(), y, reduction="none", label_smoothing=self.label_smoothing)
        loss = (loss * weights).sum()
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.total_loss += loss.detach()

    def _seek(self, step: int) -> None:
        """Set the counter to `step` (a step run on its own, outside an epoch's sequence)."""
        if self.by_counter:
            self.step_index.fill_(step)

    def _begin_epoch(self) -> None:
        """An epoch's loss sum and counter back to zero (inside the epoch's graph, or before a
        step graph's replays)."""
        self.total_loss.zero_()
        self._seek(0)

    def _train_epoch(self) -> None:
        self._begin_epoch()
        for step in range(self.train_steps):
            self._step(step)

    def _replay_epoch(self) -> None:
        """The captured epoch: replayed once, or (step scope) its step once per step."""
        if self.by_counter:
            self._begin_epoch()
            for _ in range(self.train_steps):
                self.train_graph.replay()
        else:
            self.train_graph.replay()

    def _test_step(self, step: int) -> None:
        x, y = self._batch(self.data.test_images, self.data.test_labels, self.test_order, step)
        with torch.no_grad(), _autocast(self.device, self.execution.autocast):
            hits = self.forward(x).argmax(1) == y
        self.correct += (hits & self.test_mask[step * self.batch : (step + 1) * self.batch]).sum()

    def _test_pass(self) -> None:
        self.correct.zero_()
        for step in range(self.test_steps):
            self._test_step(step)

    def _reset(self) -> None:
        """Back to the seeded start, in place: a captured graph holds these very tensors."""
        with torch.no_grad():
            for param, start in zip(self.model.parameters(), self.initial):
                param.copy_(start)
        for state in self.optimizer.state.values():
            for value in state.values():
                if torch.is_tensor(value):
                    value.zero_()
        self.optimizer.zero_grad(set_to_none=True)
        self._seek(0)

    def prepare(self, timing: Timing) -> None:
        """Warm up (compile, autotune, lazy initialisation) and capture, outside the timed epochs.

        Every shape the epochs use is warmed here: one train and one test batch shape."""
        if self.execution.compile_mode == "none" and not self.graph:
            return
        sync(self.device)
        start = time.perf_counter()
        stream = torch.cuda.Stream(self.device) if self.graph else None
        if stream is not None:  # capture needs its warm-up on a side stream
            stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            for step in range(3):
                self.train_step(min(step, self.train_steps - 1))
            self._test_step(0)
        if stream is not None:
            torch.cuda.current_stream(self.device).wait_stream(stream)
        sync(self.device)
        timing.warmup_s = time.perf_counter() - start
        if self.graph:
            start = time.perf_counter()
            self.optimizer.zero_grad(set_to_none=True)
            self._seek(0)
            self.train_graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.train_graph):
                if self.by_counter:
                    self._step(0)
                else:
                    self._train_epoch()
            self.test_graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.test_graph):
                self._test_pass()
            sync(self.device)
            timing.capture_s = time.perf_counter() - start
        self._reset()

    def before_epoch(self, epoch: int) -> None:
        """Off the clock: this epoch's permutation (the `device` variant's, exactly) and,
        pregathered, its batches."""
        self.order[: len(self.data.train_labels)].copy_(torch.from_numpy(self.sampler.rank_order(epoch)))
        if self.rates is not None:  # past the schedule's last epoch (a profiled pass): its last rates
            rates = self.rates[min(epoch, len(self.rates) - 1)]
            self.epoch_rates.copy_(rates)
            self.epoch_rates_host = rates.tolist()
        if self.pregathered:
            self.xs.copy_(unit_float(self.data.train_images[self.order], add_channel=True))
            self.ys.copy_(self.data.train_labels[self.order].long())

    def train_epoch(self, epoch: int) -> None:
        if self.train_graph is not None:
            self._replay_epoch()
        else:
            self._train_epoch()

    def profile(self, epoch: int, steps: int) -> dict:
        """Where a step's time goes (`budget`) over the first `steps` steps of one more epoch,
        `epoch`'s order set off the clock as for a timed one: the gather is the data wait, the
        update the step; a captured epoch is profiled whole (its steps cannot be marked one by
        one)."""
        self.before_epoch(epoch)
        if self.train_graph is not None:
            return timed_window(self._replay_epoch, self.device, self.train_steps)
        steps = min(steps, self.train_steps)

        def gathered(step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            self._seek(step)
            return self._gather(step)

        batches = (gathered(step) for step in range(steps))
        return profile_steps(
            batches, lambda batch: batch, lambda batch: self._update(*batch), steps, self.device, warmup=0
        )

    def test_pass(self) -> float:
        if self.test_graph is not None:
            self.test_graph.replay()
        else:
            self._test_pass()
        return self.correct.item() / max(len(self.data.test_labels), 1)


@contextlib.contextmanager
def cudnn_benchmark(device: torch.device) -> Iterator[None]:
    """Let cuDNN time its kernels per shape and keep the fastest (on CUDA).

    Set for a whole bench, not per variant: PyTorch caches cuDNN's choice per shape, dtype
    and layout but not per setting, so a variant run with it off would leave its untimed
    choices to every later variant of the same shapes (an fp32 graph captured after a variant
    ran without it can keep that variant's slower kernels)."""
    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = device.type == "cuda" or before
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = before


def train_static(
    data: Resident,
    device: torch.device,
    config: TrainConfig,
    execution: Execution,
    *,
    epochs: int,
    started: float | None = None,
    pregathered: bool = False,
    progress: str = "",
    budget: int = 0,
    until: float | None = None,
) -> Timing:
    """Train `epochs` epochs at one batch shape; see `StaticSteps`. With `budget` (a number of
    steps), that many steps of one more epoch are profiled after the timed ones
    (`StaticSteps.profile`); `until` stops after the first test pass at that accuracy."""
    started = time.perf_counter() if started is None else started
    timing = Timing()
    with cudnn_benchmark(device):
        run = StaticSteps(data, device, config, execution, pregathered=pregathered, epochs=epochs)
        run.prepare(timing)
        timing.cuda_graph = run.train_graph is not None
        sync(device)
        timing.setup_s = time.perf_counter() - started
        with timed_without_recompiles(execution, progress):
            _timed_epochs(
                timing,
                device,
                epochs,
                run.train_epoch,
                run.test_pass,
                lambda: run.total_loss.item() / run.train_steps,
                progress,
                run.before_epoch,
                until,
            )
        if budget:
            timing.budget = run.profile(epochs, budget)
    return timing


class Floor:
    """The same steps over the real split, already resident and converted, in the same order:
    what a variant with `execution`'s options would take with no data path at all.

    Its epochs are taken one at a time, spread over a whole bench (`ladder` takes one after
    every fully run variant), and the floor is the fastest of them: a neighbour's burst only ever slows
    an epoch down, so on a shared machine a quiet moment anywhere in the run sets the bound,
    not whatever the machine was doing when the floor happened to be timed."""

    def __init__(
        self, data: Resident, device: torch.device, config: TrainConfig, execution: Execution, progress: str = "floor"
    ) -> None:
        self.device, self.progress = device, progress
        self.run = StaticSteps(data, device, config, execution, pregathered=True)
        self.run.prepare(Timing())
        self.train_s: list[float] = []

    def epoch(self) -> float:
        """One more timed epoch (its own permutation, gathered off the clock); its seconds."""
        epoch = len(self.train_s)
        self.run.before_epoch(epoch)
        _, seconds = clocked(self.device, lambda: self.run.train_epoch(epoch))
        self.train_s.append(seconds)
        print(f"  {self.progress} epoch {epoch + 1}: {self.train_s[-1]:.3f} s", file=sys.stderr, flush=True)
        return self.train_s[-1]

    @property
    def seconds(self) -> float:
        return min(self.train_s)
