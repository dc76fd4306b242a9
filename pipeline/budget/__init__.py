"""The time budget of any PyTorch training loop: where its step time goes, and why.

    from pipeline.budget import TimeBudget

    budget = TimeBudget("cpu")                 # or "cuda"
    for x, y in budget.batches(loader):        # each wait for a batch is timed
        with budget.step():                    # the step: copies, forward, backward, optimizer
            ...
        if budget.done:
            break
    print(budget.result)                       # the parts per step, the verdict, and why

Modules: `intervals` (a window cut into exclusive parts, plain arithmetic), `trace` (a
torch.profiler trace read as intervals), `peak` (this device's measured matmul peak),
`threads` (the loop re-timed on one thread), `machine` (the name figures carry),
`timebudget` (the API), `verdict` (the bound, from the evidence) and `findloop` (a script's
loop found without editing it: `python -m pipeline profile`). It imports torch and nothing
of the ladder or the stages; the bench and the stages import it as any user would, through
the names below: `timed_window` for a window with no step to mark (a replayed CUDA graph),
`sync`, `usable_cores` and `duration` for a caller's own timing and printing, `Fingerprint`
and `fingerprint` for the machine every figure names.
"""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what each name is (loaded on first use, below)
    from pipeline.budget.findloop import ProfileError, profile_script
    from pipeline.budget.machine import Fingerprint, cpu_flags, fingerprint, native_bf16
    from pipeline.budget.peak import Peak, device_peak, usable_cores
    from pipeline.budget.timebudget import Budget, BudgetError, TimeBudget, checked_device
    from pipeline.budget.trace import sync, timed_window
    from pipeline.budget.units import duration
    from pipeline.budget.verdict import LadderQuote

_WHERE = {
    "Budget": "timebudget",
    "BudgetError": "timebudget",
    "TimeBudget": "timebudget",
    "checked_device": "timebudget",
    "Peak": "peak",
    "device_peak": "peak",
    "usable_cores": "peak",
    "sync": "trace",
    "timed_window": "trace",
    "duration": "units",
    "LadderQuote": "verdict",
    "profile_script": "findloop",
    "ProfileError": "findloop",
    "Fingerprint": "machine",
    "fingerprint": "machine",
    "cpu_flags": "machine",
    "native_bf16": "machine",
}
__all__ = [  # noqa: RUF022 (grouped as _WHERE is)
    "Budget",
    "BudgetError",
    "TimeBudget",
    "checked_device",
    "Peak",
    "device_peak",
    "usable_cores",
    "sync",
    "timed_window",
    "duration",
    "LadderQuote",
    "profile_script",
    "ProfileError",
    "Fingerprint",
    "fingerprint",
    "cpu_flags",
    "native_bf16",
]


def __getattr__(name: str):
    """Each name imported from its module on first use, so that `pipeline.budget.machine`
    (which the machine stage uses) loads without the profiler's code."""
    if name not in _WHERE:
        raise AttributeError(f"module 'pipeline.budget' has no attribute {name!r}")
    return getattr(importlib.import_module(f"pipeline.budget.{_WHERE[name]}"), name)
