"""A training run's checkpoints: rank 0 saves model, optimizer, data position and history
atomically; every rank reads them back on `--resume`, each figure checked as any input is."""

from __future__ import annotations

import contextlib
import math
import pickle
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist

from pipeline.core.atomic import BusyError, atomic_path, locked
from pipeline.core.errors import InputError, reason


class Checkpoints:
    """Rank 0 saves {model, optimizer, data position, history, epoch loss so far} to one file,
    atomically, every `every` optimizer steps; every rank reads it back on `--resume` (so the
    file must be where all nodes see it). Loaded with `weights_only`: a checkpoint is data,
    never code."""

    def __init__(self, path: Path | None, every: int, resume: bool) -> None:
        self.path, self.every, self.resume = (Path(path) if path else None), every, resume

    def due(self, step: int) -> bool:
        return self.path is not None and self.every > 0 and step % self.every == 0

    def save(self, state: dict) -> None:
        """Serialized in memory, then written atomically: a full disk is then an OSError on the
        write, one line naming the file and the disk, not torch's stream error."""
        if self.path is not None and dist.get_rank() == 0:
            import io

            buffer = io.BytesIO()
            torch.save(state, buffer)
            with atomic_path(self.path) as tmp:
                tmp.write_bytes(buffer.getbuffer())

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Rank 0 holds the checkpoint's run lock for the whole run (`.<name>.run.lock`): a
        second run given the same --checkpoint is refused up front, on every rank, in one line."""
        if self.path is None:
            yield
            return
        with contextlib.ExitStack() as stack:
            busy = 0
            if dist.get_rank() == 0:
                try:
                    stack.enter_context(locked(self.path.with_name(self.path.name + ".run")))
                except BusyError:
                    busy = 1
            flag = torch.tensor([busy])
            dist.broadcast(flag, 0)
            if int(flag.item()):
                raise InputError(
                    f"{self.path}: another train run holds this checkpoint (lock "
                    f"{self.path.parent / f'.{self.path.name}.run.lock'}); wait for it to finish, or "
                    f"give this run its own --checkpoint"
                )
            yield

    def load(self, device: torch.device) -> dict | None:
        if not self.resume or not self.path.exists():  # (a relaunch with --resume before any save: a fresh start)
            return None
        if not self.path.is_file():
            raise InputError(f"{self.path}: not a regular file (a checkpoint is one)")
        try:
            state = torch.load(self.path, map_location=device, weights_only=True)
        except pickle.UnpicklingError:  # (torch's text goes on to advise an unsafe load: not repeated)
            raise InputError(f"{self.path}: not a train checkpoint: it does not load as data (weights_only)") from None
        except (RuntimeError, EOFError, ValueError, OSError) as err:
            raise InputError(f"{self.path}: not a readable checkpoint ({reason(err)})") from None
        keys = {"model", "optimizer", "data", "history", "loss_so_far", "global_step", "run"}
        if not isinstance(state, dict) or not keys <= set(state):
            raise InputError(f"{self.path}: not a train checkpoint (expected keys {sorted(keys)})")
        return state

    def check(self, state: dict, run: dict) -> None:
        """The checkpoint was saved by a run of this data and these settings, and its numbers
        are in range; else one line naming the difference."""
        saved = state["run"]
        if not isinstance(saved, dict):
            raise InputError(f"{self.path}: its run record is not a dict")
        for key in sorted(set(run) | set(saved)):
            if key not in run or saved.get(key) != run[key]:
                raise InputError(
                    f"{self.path}: saved by a run with {key} = {saved.get(key)!r:.80}, this run has "
                    f"{run.get(key)!r:.80}; resume only the run that saved it"
                )
        loss, step, history = state["loss_so_far"], state["global_step"], state["history"]
        if type(loss) not in (float, int) or not (math.isfinite(loss) and 0 <= loss < 1e12):  # (a bool is no loss)
            raise InputError(f"{self.path}: loss_so_far {loss!r:.40} is not a finite non-negative number")
        if type(step) is not int or not 0 <= step < 1 << 40:
            raise InputError(f"{self.path}: global_step {step!r:.40} is out of range")
        if not isinstance(history, list) or len(history) > 1000:
            raise InputError(f"{self.path}: history is not a list of per-epoch figures")
        for place, figures in enumerate(history, 1):
            if problem := epoch_problem(figures, place):
                raise InputError(f"{self.path}: history epoch {place}: {problem}")
        if not isinstance(state["data"], dict):
            raise InputError(f"{self.path}: data position is not a dict")
        if state["data"].get("epoch") != len(history):  # a saved position is always in the epoch after its history
            raise InputError(
                f"{self.path}: data position is in epoch {state['data'].get('epoch')!r:.20}, but its "
                f"history holds {len(history)} finished epochs"
            )


# One finished epoch in a run's history (and in its out.json): each figure's range. A resumed
# checkpoint's history is copied into the run's out.json, so it is checked as any input is.
EPOCH_FIGURES = {
    "epoch": "int",
    "loss": "non-negative",
    "accuracy": "fraction",
    "steps": "int",
    "seconds": "non-negative",
    "read_seconds": "non-negative",
    "fetched_bytes": "int",
    "world_size": "int",  # the ranks that trained it (its rest, when resumed mid-epoch)
    "resumed_at_sample": "int",  # samples of it trained before this run resumed: seconds cover the rest
}
# Figures added since: an older checkpoint's epochs lack them, read as unknown (null).
LATER = ("world_size", "resumed_at_sample")


def epoch_problem(figures: object, place: int) -> str | None:
    """What is wrong with the history's `place`-th epoch (1 first), or None: exactly the
    figures an epoch records; `epoch` its place (the epochs in order); counts integers
    >= 0; losses and seconds finite and >= 0; the accuracy in [0, 1]. An older checkpoint's
    epoch lacks the LATER figures, or holds them unknown (None)."""
    known = (set(EPOCH_FIGURES), set(EPOCH_FIGURES) - set(LATER))
    if not isinstance(figures, dict) or set(figures) not in known:
        held = sorted(map(str, figures)) if isinstance(figures, dict) else type(figures).__name__
        return f"holds {str(held)[:160]}, not an epoch's figures {sorted(EPOCH_FIGURES)}"
    for key, kind in EPOCH_FIGURES.items():
        value = figures.get(key)
        if value is None and key in LATER:
            continue
        if kind == "int":
            if type(value) is not int or not 0 <= value < 1 << 53:
                return f"{key} {value!r:.40} is not a whole number >= 0"
        elif type(value) not in (int, float) or not math.isfinite(value) or value < 0:
            return f"{key} {value!r:.40} is not a finite number >= 0"
        elif kind == "fraction" and value > 1:
            return f"{key} {value!r:.40} is not in [0, 1]"
    if figures["epoch"] != place:
        return f"is numbered {figures['epoch']}: a history holds epochs 1, 2, ... in order"
    return None
