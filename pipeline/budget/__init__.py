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
of the ladder or the stages; the bench imports it as any user would.
"""

import importlib

_WHERE = {
    "Budget": "timebudget",
    "BudgetError": "timebudget",
    "TimeBudget": "timebudget",
    "checked_device": "timebudget",
    "Peak": "peak",
    "device_peak": "peak",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    """Each name imported from its module on first use, so that `pipeline.budget.machine`
    (which the machine stage uses) loads without the profiler's code."""
    if name not in _WHERE:
        raise AttributeError(f"module 'pipeline.budget' has no attribute {name!r}")
    return getattr(importlib.import_module(f"pipeline.budget.{_WHERE[name]}"), name)
