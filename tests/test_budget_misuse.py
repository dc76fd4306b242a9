"""The own-loop API (`pipeline.budget.TimeBudget`) used wrongly, as users do: every misuse
ends in one line of the library's own error (`BudgetError`, an `InputError`) that says what
the loop did and what to change, where it happens or when `result` is read; `result` is
never None. A loop that ends inside the window still gives the steps it finished, marked
partial."""

from __future__ import annotations

import re

import pytest
import torch

from pipeline.budget import BudgetError, TimeBudget
from pipeline.core.errors import InputError


def quiet(steps: int = 4, skip: int = 1, **options) -> TimeBudget:
    """A budget with nothing but the window: no thread check, no peak probe, no FLOPs."""
    return TimeBudget("cpu", steps=steps, skip=skip, flops=False, threads_check=0, peak=None, **options)


def one_line(caught: pytest.ExceptionInfo) -> str:
    message = str(caught.value)
    assert isinstance(caught.value, InputError) and "\n" not in message and message, message
    return message


def loop(budget: TimeBudget, batches: int, step: bool = True) -> None:
    for _ in budget.batches(range(batches)):
        if step:
            with budget.step():
                torch.ones(2).add_(1)


def test_a_loop_that_never_enters_step_is_told_to_mark_its_step():
    budget = quiet()
    loop(budget, 10, step=False)
    with pytest.raises(BudgetError) as caught:
        print(budget.result)
    assert one_line(caught) == (
        "no budget: the loop took 10 batch(es) from budget.batches() but never entered "
        "budget.step(); mark the step: `with budget.step():` around forward, backward "
        "and the optimizer's step"
    )
    assert not budget.done and not budget.profiling


def test_steps_without_batches_are_told_to_wrap_the_loader():
    budget = quiet()
    for _ in range(10):
        with budget.step():
            pass
    with pytest.raises(BudgetError) as caught:
        budget.result
    assert one_line(caught) == (
        "no budget: budget.step() ran 10 time(s) but no batch came through budget.batches(), "
        "where the window opens; wrap the loader: `for batch in budget.batches(loader):`"
    )
    with pytest.raises(BudgetError, match=r"^no budget: nothing ran through this budget; wrap the loader"):
        quiet().result  # a budget nothing ran through


@pytest.mark.parametrize("skip", [0, 1, 5])
def test_an_empty_loader_says_how_many_batches_a_budget_needs(skip):
    budget = quiet(steps=20, skip=skip)
    loop(budget, 0)
    with pytest.raises(BudgetError) as caught:
        budget.result
    assert one_line(caught) == (
        f"no budget: the loader gave no batch; a budget needs at least skip + 1 = {skip + 1} "
        f"batches with a step each (skip + steps = {skip + 20} for a full window)"
    )
    assert not budget.profiling


@pytest.mark.parametrize("batches", [3, 5])
def test_a_loader_shorter_than_the_warm_up_says_what_it_saw_and_what_it_needs(batches):
    budget = quiet(steps=20, skip=5)
    loop(budget, batches)
    with pytest.raises(BudgetError) as caught:
        budget.result
    assert one_line(caught) == (
        f"no budget: the loader ended after {batches} batch(es) and {batches} step(s), all in "
        "the warm-up (skip=5); a budget needs at least skip + 1 = 6 batches with a step each "
        "(skip + steps = 25 for a full window): give a longer loader or a lower skip"
    )


@pytest.mark.parametrize("batches, steps", [(6, 1), (10, 5), (24, 19)])
def test_a_loader_that_ends_inside_the_window_gives_the_steps_it_finished_marked_partial(batches, steps):
    budget = quiet(steps=20, skip=5)
    loop(budget, batches)
    result = budget.result
    assert result.partial and result.per_step["steps"] == steps and budget.done
    said = " ".join(str(result).split())  # as read, whatever the wrapping
    assert f"({steps} steps on cpu" in said and "partial: the loop ended or stopped first" in said


def test_the_warm_up_goes_on_across_epochs_shorter_than_it():
    """Epochs of 3 batches, skip 5: `result` says what is missing after the first; the window
    opens in the second, after its 2nd batch, and that epoch's end cuts it: 1 step, partial."""
    budget = quiet(steps=4, skip=5)
    loop(budget, 3)
    with pytest.raises(BudgetError, match=r"^no budget: the loader ended after 3 batch\(es\) and 3 step\(s\)"):
        budget.result
    for _ in range(3):
        loop(budget, 3)
    assert budget.result.per_step["steps"] == 1 and budget.result.partial and budget.seen == 12


def test_result_read_inside_the_loop_says_what_is_still_to_come():
    saved = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        budget = TimeBudget("cpu", steps=2, skip=2, flops=False, threads_check=4, peak=None)
        said = []
        for i in budget.batches(range(20)):
            with budget.step():
                pass
            if not budget.done:
                with pytest.raises(BudgetError) as caught:
                    budget.result
                said.append(one_line(caught))
    finally:
        torch.set_num_threads(saved)
    assert said[0] == "no budget yet: 1 of the 2 warm-up batches taken; the window of 2 steps opens after them"
    assert said[2] == (
        "no budget yet: the profiled window has 1 of its 2 steps; read `result` once `budget.done` is "
        "true or the loop has ended"
    )
    assert re.fullmatch(
        r"no budget yet: the window is profiled and the thread check has re-timed 0 of its \d+ steps; "
        r"read `result` once `budget.done` is true or the loop has ended",
        said[3],
    ), said[3]
    assert budget.done and budget.result.threads is not None


@pytest.mark.parametrize("steps", [3, 4])
def test_a_step_inside_a_step_is_refused_where_it_starts(steps):
    """Before: every step counted twice ("38 steps" for 19 batches), or the library's own
    AttributeError when the window ended on the inner step."""
    budget = quiet(steps=steps, skip=1)
    reached = []
    with pytest.raises(BudgetError) as caught:
        for _ in budget.batches(range(19)):
            with budget.step():
                with budget.step():
                    reached.append(True)
    assert one_line(caught) == (
        "budget.step() inside budget.step(): one step at a time; mark each step once, around "
        "forward, backward and the optimizer's step (budget.copy() marks a copy inside it)"
    )
    assert reached == [] and not budget.profiling
    loop(budget, 0)  # the budget itself is usable again: its next step is a step
    with budget.step():
        pass


def test_two_windows_open_at_once_are_refused_where_the_second_starts():
    """Before: a raw `ValueError: a profiled pass with no marked range` at the end."""
    first, second = quiet(skip=0), quiet(skip=0)
    with pytest.raises(BudgetError) as caught:
        for _ in first.batches(second.batches(range(10))):
            with first.step():
                with second.step():
                    pass
    assert one_line(caught) == (
        "another TimeBudget's window is open (a window of 4 steps on cpu): one window at a "
        "time; let it finish (its `done`) before this budget's window opens, or give this "
        "one a larger skip"
    )
    assert not first.profiling and not second.profiling
    after = quiet()  # the first window closed with the loop: the next budget profiles
    loop(after, 6)
    assert after.result.per_step["steps"] == 4


def test_two_budgets_one_after_the_other_each_profile():
    first, second = quiet(), quiet()
    loop(first, 8)
    loop(second, 8)
    assert first.result.per_step["steps"] == second.result.per_step["steps"] == 4


@pytest.mark.parametrize("loader, shown", [(5, "int 5"), (None, "NoneType None"), (2.5, "float 2.5")])
def test_batches_of_something_not_iterable_is_refused_naming_the_argument(loader, shown):
    """Refused when `batches` is called, not at the first batch (before: a raw TypeError)."""
    with pytest.raises(BudgetError) as caught:
        quiet().batches(loader)
    assert one_line(caught) == (
        f"budget.batches(loader): loader must be iterable (a DataLoader, a list of batches, a generator), got {shown}"
    )


def test_batches_takes_any_iterable_and_the_old_sequence_protocol():
    class Items:  # __getitem__ up to an IndexError: iter() takes it
        def __getitem__(self, i):
            if i >= 6:
                raise IndexError(i)
            return i

    for loader in (Items(), [0, 1, 2, 3, 4, 5], (i for i in range(6)), range(6)):
        budget, seen = quiet(), []
        for item in budget.batches(loader):
            with budget.step():
                seen.append(item)
        assert seen == list(range(6)) and budget.result.per_step["steps"] == 4, loader


@pytest.mark.parametrize(
    "trace, shown", [(123, "int 123"), (b"t.json", "bytes b't.json'"), ("", "str ''"), (True, "bool True")]
)
def test_a_trace_that_is_not_a_path_is_refused_naming_trace(trace, shown):
    with pytest.raises(BudgetError) as caught:
        TimeBudget("cpu", trace=trace)
    assert one_line(caught) == f"trace must be a file path (a str or a Path) or None, got {shown}"


def test_a_trace_given_as_a_path_is_written(tmp_path):
    budget = quiet(trace=tmp_path / "trace.json")
    loop(budget, 6)
    assert budget.done and (tmp_path / "trace.json").stat().st_size > 0


def test_a_trace_that_cannot_be_written_is_refused_when_the_budget_is_made(tmp_path):
    """A missing folder or a folder's own path: said before the loop runs, not after it."""
    for trace, said in ((tmp_path / "nope" / "t.json", "does not exist"), (tmp_path, "is a folder")):
        with pytest.raises(BudgetError) as caught:
            quiet(trace=trace)
        assert said in one_line(caught)


def test_a_trace_write_that_fails_is_an_error_and_keeps_the_trace_before(tmp_path):
    """Torch's exporter logs a failed write and returns: the budget says so in one line, keeps
    the trace that was there and leaves no temporary. Run where files may grow to 64 KiB
    (`ulimit -f`), far less than a trace of the window."""
    import subprocess
    import sys

    trace = tmp_path / "trace.json"
    trace.write_text('{"old": true}')
    script = f"""
import resource, signal, torch
from pipeline.budget import TimeBudget
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10))
budget = TimeBudget("cpu", steps=4, skip=1, flops=False, threads_check=0, peak=None, trace={str(trace)!r})
try:
    for _ in budget.batches(range(200)):
        with budget.step():
            for _ in range(200):
                torch.ones(8).add_(1)
except Exception as err:
    print(type(err).__name__, err)
else:
    print("no error")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.stdout.startswith("SystemFailure " + str(trace) + ": the trace could not be written"), done
    assert "the trace there before is kept" in done.stdout, done.stdout
    assert trace.read_text() == '{"old": true}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.json"]
