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

from pipeline.budget.peak import Peak, device_peak
from pipeline.budget.timebudget import Budget, TimeBudget, checked_device

__all__ = ["Budget", "Peak", "TimeBudget", "checked_device", "device_peak"]
