"""`python -m pipeline profile SCRIPT ARGS`: the time budget of a training script left as it
is, its loop found through the DataLoader it iterates and the optimizer it steps."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]

# A loop built to wait for its data: each item sleeps in __getitem__, the model is tiny.
# A test loader is iterated after every epoch, without an optimizer step: it must not be
# the one profiled. The script's own arguments set the epochs; it writes a file at its end.
SCRIPT = """
import sys, time
from pathlib import Path
import torch
from torch.utils.data import DataLoader, Dataset

class Slow(Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        time.sleep(SLEEP)
        return torch.full((8,), float(i % 4)), i % 4

epochs, done = int(sys.argv[1]), Path(sys.argv[2])
torch.manual_seed(0)
model = torch.nn.Linear(8, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
train, test = DataLoader(Slow(), batch_size=4), DataLoader(Slow(), batch_size=16)
for epoch in range(epochs):
    for x, y in train:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        for x, y in test:
            model(x)
done.write_text("finished")
"""


def script(tmp_path: Path, sleep: float = 0.02, body: str = SCRIPT) -> Path:
    path = tmp_path / "train.py"
    path.write_text(body.replace("SLEEP", str(sleep)))
    return path


def started(args: list[str], cwd: Path) -> subprocess.Popen:
    """`python -m pipeline profile ARGS` started, its output read as it comes (for Ctrl-C)."""
    return subprocess.Popen(
        [sys.executable, "-m", "pipeline", "profile", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "XDG_CACHE_HOME": os.environ["XDG_CACHE_HOME"]},
    )


def profile(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pipeline", "profile", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "XDG_CACHE_HOME": os.environ["XDG_CACHE_HOME"]},
    )


@pytest.mark.slow
def test_a_script_is_profiled_unchanged_and_stopped_after_the_window(tmp_path):
    # 50 ms a loader item, four a batch: a data wait of 200 ms a step, far above what a busy
    # host's preemptions add to the tiny step (65 ms seen beside four spinning processes)
    path = script(tmp_path, sleep=0.05)
    done = profile(
        "--device",
        "cpu",
        "--steps",
        "6",
        "--skip",
        "2",
        "--json",
        "budget.json",
        "--trace",
        "trace.json",
        str(path),
        "3",
        "done.txt",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "(6 steps on cpu, " in done.stdout
    budget = json.loads((tmp_path / "budget.json").read_text())
    assert budget["script"] == "train.py" and budget["steps"] == 6
    # The data wait is the bound; unless the thread check (on in `profile`) timed the loop
    # slower with more threads, as a busy host can make it: then the verdict says that, and
    # what the step's parts were as measured with the threads waiting.
    said = done.stdout.replace("\n", " ")  # the report is wrapped at 100 columns
    if budget["bound"] == "threads":
        assert "THREAD CONTENTION-BOUND" in said and "slower with more threads" in said
        assert "as measured with the threads waiting: data wait" in said
    else:
        assert budget["bound"] == "data_wait" and "DATA WAIT-BOUND" in done.stdout
    # each wait for a batch holds its four items' 50 ms sleeps (a loaded host wakes late, never early)
    assert budget["partial"] is False and budget["data_wait_s"] >= 0.2 - 1e-5
    parts = [budget[f"{part}_s"] for part in ("data_wait", "copy", "compute", "overhead", "other")]
    assert sum(parts) == pytest.approx(budget["step_s"], abs=1e-5)
    names = {event.get("name") for event in json.loads((tmp_path / "trace.json").read_text())["traceEvents"]}
    assert {"budget:step", "budget:data_wait"} <= names
    assert not (tmp_path / "done.txt").exists()  # stopped after the window


@pytest.mark.slow
def test_keep_going_lets_the_script_finish_and_the_test_loader_is_never_taken(tmp_path):
    path = script(tmp_path, sleep=0.0)
    # 16 train batches an epoch: a window of 20 from step 2 cannot fit in the first epoch
    done = profile(
        "--device",
        "cpu",
        "--steps",
        "20",
        "--skip",
        "2",
        "--keep-going",
        "--json",
        "b.json",
        str(path),
        "2",
        "done.txt",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "done.txt").read_text() == "finished"
    budget = json.loads((tmp_path / "b.json").read_text())
    # --skip 2 counts from the script's first step (2 found the loop): steps 2..15, 14 to the epoch's end: partial
    assert budget["partial"] is True and budget["steps"] == 14


@pytest.mark.slow
def test_a_window_the_epochs_end_cut_short_still_stops_the_script_and_says_partial(tmp_path):
    path = script(tmp_path, sleep=0.0)
    done = profile("--steps", "20", "--skip", "2", "--json", "b.json", str(path), "3", "done.txt", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    said = " ".join(done.stdout.split())  # as read, whatever the wrapping
    assert "(14 steps on cpu, " in said and ", partial: the loop ended or stopped first; " in said
    assert json.loads((tmp_path / "b.json").read_text())["partial"] is True
    assert not (tmp_path / "done.txt").exists()  # stopped when the loop came back for its next epoch


@pytest.mark.slow
def test_a_script_that_changes_folder_and_exits_through_sys_exit_keeps_its_budget(tmp_path):
    body = SCRIPT.replace(
        "epochs, done = int(sys.argv[1]), Path(sys.argv[2])",
        "epochs, done = int(sys.argv[1]), Path(sys.argv[2]).resolve()\nimport os; os.chdir('/')",
    )
    body += "sys.exit(0)\n"
    path = script(tmp_path, sleep=0.0, body=body)
    done = profile(
        "--steps",
        "4",
        "--skip",
        "2",
        "--keep-going",
        "--json",
        "b.json",
        "--trace",
        "t.json",
        str(path),
        "1",
        "done.txt",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "done.txt").exists() and json.loads((tmp_path / "b.json").read_text())["steps"] == 4
    assert (tmp_path / "t.json").is_file()  # written where it was asked, not in the script's new folder


def test_the_budget_runs_on_the_device_the_loop_trains_on():
    """No --device: the optimizer's parameters say where the loop trains; a --device of
    another type is refused before anything is measured on the wrong one."""
    from pipeline.budget.findloop import ProfileError, Refused, Watch

    optimizer = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    watch = Watch(None, steps=3, skip=1, trace=None, keep_going=False)
    watch.stepped(optimizer, (), {})
    assert watch.start().device == torch.device("cpu") and watch.optimizer_steps == 1
    wrong = Watch(torch.device("cuda"), steps=3, skip=1, trace=None, keep_going=False)
    wrong.stepped(optimizer, (), {})
    with pytest.raises(Refused) as refused:  # raised inside the script: past its `except Exception`
        wrong.start()
    assert isinstance(refused.value.error, ProfileError)
    assert str(refused.value.error) == (
        "--device cuda: the script's loop trains on cpu (its optimizer's parameters); give --device cpu or leave "
        "--device out"
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "body, message",
    [
        (
            "import torch\nprint('no loop')\n",
            r"found no training loop \(it iterated 0 DataLoader\(s\) and stepped an "
            r"optimizer 0 time\(s\)",
        ),
        (  # the one line names the case a user hits first: a replayed CUDA graph steps no optimizer
            SCRIPT.replace("optimizer.step()", "pass"),
            r"found no training loop \(it iterated 4 DataLoader\(s\).*a loop that replays a captured CUDA graph "
            r"steps none per batch\)\. Otherwise wrap the loop in TimeBudget",
        ),
        (  # argparse's --help, or any sys.exit(0) before training
            "import sys\nprint('usage: train.py EPOCHS')\nsys.exit(0)\n",
            r"found no training loop \(it iterated 0 DataLoader\(s\).*\); it exited \(status 0\) before training, "
            r"as after its --help; the command finds",
        ),
        (
            SCRIPT.replace("range(epochs)", "range(1)").replace("return 64", "return 8"),
            r"ended after 2 batches, before the profiled window's first step \(skip 5\); lower --skip",
        ),
    ],
)
def test_a_script_without_a_loop_the_command_can_see_is_one_line(tmp_path, body, message):
    path = script(tmp_path, sleep=0.0, body=body)
    done = profile("--device", "cpu", str(path), "2", "done.txt", cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert len(done.stderr.strip().splitlines()) == 1
    import re

    assert re.search(message, done.stderr), done.stderr


def test_a_folder_with_a_main_module_is_profiled_as_python_runs_it(tmp_path):
    # `python DIR` runs DIR/__main__.py; the command said "no such script"
    app = tmp_path / "app"
    app.mkdir()
    (app / "__main__.py").write_text(SCRIPT.replace("SLEEP", "0.0"))
    done = profile("--device", "cpu", "--skip", "1", "--steps", "3", str(app), "1", "done.txt", cwd=tmp_path)
    assert done.returncode == 0 and "(3 steps on cpu" in done.stdout, done.stderr[-2000:]
    empty = tmp_path / "empty"
    empty.mkdir()
    refused = profile("--device", "cpu", str(empty), cwd=tmp_path)
    assert refused.returncode == 2 and "no such script" in refused.stderr


def test_a_missing_script_is_one_line(tmp_path):
    done = profile("--device", "cpu", str(tmp_path / "nope.py"), cwd=tmp_path)
    assert (
        done.returncode == 2
        and done.stderr.strip() == f"Error: {tmp_path / 'nope.py'}: no such script (give the path of a Python file)"
    )


MARKED = """
import sys, time, torch
from torch.utils.data import DataLoader
marked = int(sys.argv[1])
model = torch.nn.Linear(1, 1)
optimizer = torch.optim.SGD(model.parameters(), 0.1)
for i, x in enumerate(DataLoader(torch.arange(20.0).reshape(20, 1), batch_size=1)):
    if i == marked:
        time.sleep(1.0)
    optimizer.zero_grad()
    model(x).sum().backward()
    optimizer.step()
"""


@pytest.mark.parametrize("skip, first", [(5, 5), (0, 2)])
def test_skip_counts_the_scripts_steps_from_its_first(tmp_path, skip, first):
    """`--skip 5 --steps 1` profiles the script's step 5 (counted from 0), as TimeBudget's
    skip=5 does; the first two steps find the loop, so `--skip 0` profiles step 2. The marked
    step sleeps a second: only the window that holds it can take a second."""
    path = script(tmp_path, body=MARKED)
    out = tmp_path / "budget.json"
    done = profile(
        "--device", "cpu", "--skip", str(skip), "--steps", "1", "--json", str(out), str(path), str(first), cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text())["step_s"] >= 1.0


@pytest.mark.parametrize("flag", ["--json", "--trace"])
def test_an_output_that_cannot_be_written_is_refused_before_the_script_runs(tmp_path, flag):
    """A folder given as the file, or a file in a folder that does not exist: said before the
    script starts (it would have run its whole window first)."""
    ran = tmp_path / "ran"
    path = script(tmp_path, body=f"open({str(ran)!r}, 'w').close()\n" + SCRIPT)
    for output, said in ((tmp_path, "is a directory"), (tmp_path / "nope" / "out.json", "does not exist")):
        done = profile(flag, str(output), "--device", "cpu", str(path), cwd=tmp_path)
        assert done.returncode == 2 and said in done.stderr and "Traceback" not in done.stderr, done.stderr
        assert not ran.exists()


@pytest.mark.slow
def test_the_examples_run_and_give_a_verdict(tmp_path):
    """examples/own_loop.py (TimeBudget in the loop) and examples/plain_train.py under the
    command (no edit) profile the same per-item loop: both print a budget and its bound."""
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "XDG_CACHE_HOME": os.environ["XDG_CACHE_HOME"]}
    own = subprocess.run(
        [sys.executable, "examples/own_loop.py"], capture_output=True, text=True, cwd=ROOT, timeout=300, env=env
    )
    assert own.returncode == 0, own.stderr[-2000:]
    plain = profile(
        "--device", "cpu", "--json", str(tmp_path / "b.json"), "examples/plain_train.py", "--epochs", "1", cwd=ROOT
    )
    assert plain.returncode == 0, plain.stderr[-2000:]
    for out in (own.stdout, plain.stdout):
        assert "(20 steps on cpu, " in out, out
        # On a busy host the profiled window may run far slower than the plain clock: then the
        # command gives no verdict and says why, which is the right answer there.
        disturbed = "x the plain clock's" in out
        # a verdict, its evidence called weak or not (load moves the step's share of the peak)
        bound = re.search(r"-BOUND( \(weak evidence\))?: ", out)
        assert disturbed or (bound and "\nWhy: " in out), out
    for err in (own.stderr, plain.stderr):  # Kineto's own log lines never reach the user
        assert "USDT:" not in err and "profiler_start" not in err, err
    assert "epoch 1:" not in plain.stdout  # stopped after the window, before the epoch's end


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["data", "launch", "tiny"])
def test_the_verdict_loops_run_under_the_command_with_the_device_named(kind):
    """benchmarks/verdict_loops.py, which the `gpu` tests profile on CUDA, on the CPU here:
    each loop trains on the device its second argument names and gets a budget and a bound
    (or, on a busy host, says why not)."""
    done = profile("--steps", "10", "--skip", "3", "benchmarks/verdict_loops.py", kind, "cpu", cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "(10 steps on cpu, " in done.stdout, done.stdout
    assert "x the plain clock's" in done.stdout or "-BOUND" in done.stdout, done.stdout


@pytest.mark.parametrize(
    "body, message",
    [
        (
            "import time\nwhile True:\n    time.sleep(0.01)\n",
            r"stopped after 2 s \(--timeout\) before its window was "
            r"profiled: it iterated 0 DataLoader\(s\) and stepped an optimizer 0 time\(s\)",
        ),
        (
            SCRIPT.replace("optimizer.step()", "pass").replace("range(epochs)", "iter(int, 1)"),
            r"stopped after 2 s \(--timeout\) before its window was profiled: it iterated \d+ DataLoader\(s\)",
        ),
    ],
)
def test_a_script_that_never_reaches_a_window_is_stopped_at_its_timeout(tmp_path, body, message):
    """No loop at all, or a loop that never steps an optimizer, forever: stopped at --timeout
    (here 2 s; bounded by the test's own deadline), one line saying what was seen."""
    import re

    path = script(tmp_path, sleep=0.0, body=body)
    done = profile("--device", "cpu", "--timeout", "2", str(path), "2", "done.txt", cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert len(done.stderr.strip().splitlines()) == 1 and re.search(message, done.stderr), done.stderr


def test_a_script_that_raises_shows_its_own_traceback_then_one_line(tmp_path):
    body = "import torch\n\ndef load():\n    raise ValueError('no such column: pixels')\n\nload()\n"
    path = script(tmp_path, sleep=0.0, body=body)
    done = profile("--device", "cpu", str(path), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[0] == "Traceback (most recent call last):" and "ValueError: no such column: pixels" in lines
    assert f'File "{path}", line 6, in <module>' in done.stderr and f'File "{path}", line 4, in load' in done.stderr
    assert "pipeline" not in "\n".join(lines[:-1]) and "runpy" not in done.stderr  # the script's frames only
    assert lines[-1] == f"Error: {path}: raised ValueError before its loop was profiled (above)"


def test_a_script_that_does_not_compile_is_one_line_with_file_and_line(tmp_path):
    path = script(tmp_path, sleep=0.0, body="import torch\nfor x in range(3)\n    pass\n")
    done = profile("--device", "cpu", str(path), cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"Error: {path}:2: SyntaxError: expected ':' (the script does not compile)"
    ]


def test_a_file_that_is_not_python_source_is_one_line_naming_it(tmp_path):
    # a binary read as source has no file name in its SyntaxError: "None:None" was printed;
    # Python 3.11.2 raises ValueError instead, which read as the script's own failure
    path = tmp_path / "a.out"
    path.write_bytes(b"\x7fELF\x00\x00binary")
    done = profile("--device", "cpu", str(path), cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        f"Error: {path}: not Python source (it holds NUL bytes: a binary file?)"
    ], done.stderr


def test_a_script_raising_inside_its_window_is_said_to_have_done_so(tmp_path):
    raising = SCRIPT.replace(
        "        optimizer.step()\n",
        "        optimizer.step()\n        if y.sum() < 0 or len(seen) == 6:\n            raise ValueError('bad batch')\n        seen.append(1)\n",
    )
    raising = raising.replace("for epoch in range(epochs):", "seen = []\nfor epoch in range(epochs):")
    path = script(tmp_path, sleep=0.0, body=raising)
    done = profile("--device", "cpu", "--skip", "3", "--steps", "10", str(path), "1", "done.txt", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert (
        done.stderr.strip().splitlines()[-1] == f"Error: {path}: raised ValueError inside its profiled window (above)"
    )


def test_an_output_in_a_folder_that_cannot_be_written_is_said_before_the_script_runs(tmp_path):
    path = script(tmp_path, sleep=0.0)
    for option in ("--trace", "--json"):
        done = profile("--device", "cpu", option, "/proc/budget.json", str(path), "1", "done.txt", cwd=tmp_path)
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert done.stderr.startswith("Error: /proc/budget.json: cannot be written") and "Traceback" not in done.stderr
        assert not (tmp_path / "done.txt").exists()  # the script never ran


def test_a_ladder_that_is_not_a_bench_document_is_refused_in_one_line(tmp_path):
    """--ladder names the rungs the verdict quotes: a file that is not a bench metrics document
    is refused before the script runs, not ignored; report() refuses a non-document too."""
    from pipeline.budget.timebudget import BudgetError

    (tmp_path / "not-a-ladder.json").write_text('{"mnist": {"MB": 10.0}}')
    path = script(tmp_path, sleep=0.0)
    done = profile("--device", "cpu", "--ladder", "not-a-ladder.json", str(path), "1", "done.txt", cwd=tmp_path)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith("Error: not-a-ladder.json: ") and not (tmp_path / "done.txt").exists()
    from pipeline.budget import TimeBudget

    budget = TimeBudget("cpu", steps=1, skip=0, flops=False, threads_check=0, peak=None)
    for _ in budget.batches([1, 2]):
        with budget.step():
            pass
    with pytest.raises(BudgetError, match=r"^report\(ladder\): expected a bench metrics document"):
        budget.result.report({"mnist": 1})


def test_the_commands_own_refusal_inside_the_loop_is_its_one_line_not_the_scripts_failure(tmp_path):
    """A --device of another type is refused where the loop is found, inside the script: the
    refusal stays the command's ProfileError, even past the script's own `except Exception`."""
    from pipeline.budget.findloop import ProfileError, profile_script

    guarded = SCRIPT.replace("for epoch in range(epochs):", "try:\n  for epoch in range(epochs):").replace(
        'done.write_text("finished")', 'except Exception:\n    pass\ndone.write_text("finished")'
    )
    guarded = "\n".join(
        ("  " + line if line.startswith("    ") or line.startswith("        ") else line)
        for line in guarded.splitlines()
    )
    path = script(tmp_path, sleep=0.0, body=guarded)
    compile(path.read_text(), str(path), "exec")  # the guarded script is valid Python
    with pytest.raises(ProfileError, match=r"^--device meta: the script's loop trains on cpu"):
        profile_script(path, ["1", str(tmp_path / "done.txt")], device="meta", steps=2, skip=1, timeout_s=60)


@pytest.mark.slow
def test_keep_going_lets_the_script_run_past_the_timeout_once_the_window_is_done(tmp_path):
    """--timeout bounds the wait for the window; after it, --keep-going runs to the end."""
    body = SCRIPT + "import time\ntime.sleep(31)\ndone.write_text('finished late')\n"  # past the timeout
    path = script(tmp_path, sleep=0.0, body=body)
    done = profile(
        "--device",
        "cpu",
        "--timeout",
        "30",  # room to reach the window on a busy host; the script then sleeps past it
        "--steps",
        "2",
        "--skip",
        "1",
        "--keep-going",
        str(path),
        "1",
        "done.txt",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "done.txt").read_text() == "finished late"


@pytest.mark.parametrize(
    "ending, line", [("sys.exit(3)", "exited with status 3"), ("raise KeyError('x')", "raised KeyError")]
)
def test_keep_going_reports_the_window_then_a_failing_end_with_exit_2(tmp_path, ending, line):
    # the script failed after a whole window: --keep-going exited 0 for sys.exit(3), and
    # printed no report (nor JSON) for an exception
    path = script(tmp_path, sleep=0.0, body=SCRIPT + f"import sys\n{ending}\n")
    done = profile(
        "--device",
        "cpu",
        "--skip",
        "1",
        "--steps",
        "3",
        "--keep-going",
        "--json",
        "b.json",
        str(path),
        "1",
        "done.txt",
        cwd=tmp_path,
    )
    assert done.returncode == 2 and "(3 steps on cpu" in done.stdout and "-BOUND" in done.stdout, done.stdout
    assert done.stderr.strip().splitlines()[-1].startswith(f"Error: {path}: {line} after its window was profiled")
    assert json.loads((tmp_path / "b.json").read_text())["steps"] == 3 and (tmp_path / "done.txt").exists()


def test_ctrl_c_is_one_line_and_status_130(tmp_path):
    """Ctrl-C in any command ends in one line and exit 130, not click's "Aborted!" or a
    traceback: here while a profiled script waits for its first batch."""
    import signal
    import time

    path = script(tmp_path, sleep=0.0, body="import sys, time\nprint('ready', flush=True)\ntime.sleep(60)\n")
    proc = started(["--device", "cpu", str(path)], tmp_path)
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)  # a bound on the wait, not a measure
    finally:
        if proc.poll() is None:
            proc.kill()
    assert (
        proc.returncode == 130
        and err.strip() == "Stopped (Ctrl-C): every output holds its last whole version, none half-written"
    ), err


def test_ctrl_c_inside_the_window_leaves_the_trace_and_json_there_before(tmp_path):
    # closing the window on the way out exported its trace over the old one, while the
    # command said nothing was replaced
    import signal

    slow = SCRIPT.replace(
        "        optimizer.step()\n",
        "        optimizer.step()\n        print('step', flush=True)\n        time.sleep(0.2)\n",
    )
    path = script(tmp_path, sleep=0.0, body=slow)
    (tmp_path / "t.json").write_text("old trace")
    (tmp_path / "b.json").write_text("old budget")
    options = ["--device", "cpu", "--skip", "2", "--steps", "500", "--trace", "t.json", "--json", "b.json"]
    proc = started([*options, str(path), "9", "done.txt"], tmp_path)
    try:
        for _ in range(6):  # the window opens after the second step
            assert proc.stdout.readline().strip() == "step"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)  # a bound on the wait, not a measure
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and err.strip().endswith(
        "Stopped (Ctrl-C): every output holds its last whole version, none half-written"
    ), err
    assert (tmp_path / "t.json").read_text() == "old trace" and (tmp_path / "b.json").read_text() == "old budget"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.json", "t.json", "train.py"]  # no temporary left
