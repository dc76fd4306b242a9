"""A train checkpoint is one run's: a second run given the same --checkpoint is refused up
front, and a checkpoint that cannot be written (a full disk, a size limit) is one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PRELUDE = """
import sys
from pathlib import Path
import torch.distributed as dist
from pipeline.core.errors import InputError
from pipeline.stages.train.checkpoints import Checkpoints
folder = Path(sys.argv[1])
dist.init_process_group("gloo", init_method=f"file://{folder / 'store'}", rank=0, world_size=1)
checkpoints = Checkpoints(folder / "ckpt.pt", 1, False)
"""

HOLD = (
    PRELUDE
    + """
with checkpoints.held():
    print("holding", flush=True)
    sys.stdin.readline()
dist.destroy_process_group()
"""
)

# As the train stage does, the process group is destroyed before the process exits (gloo's
# threads left running at exit can abort the interpreter on a busy host).
SECOND = (
    PRELUDE
    + """
code = 0
try:
    with checkpoints.held():
        print("ran")
except InputError as err:
    print(err, file=sys.stderr)
    code = 2
finally:
    dist.destroy_process_group()
sys.exit(code)
"""
)

FULL = (
    PRELUDE
    + """
import resource
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))  # (Python ignores SIGXFSZ)
code = 0
try:
    checkpoints.save({"weights": list(range(100_000))})
except InputError as err:
    print(err, file=sys.stderr)
    code = 2
finally:
    dist.destroy_process_group()
sys.exit(code)
"""
)


def _python(code: str, folder: Path, **options) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", code, str(folder)],
        cwd=ROOT,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **options,
    )


def test_a_second_run_on_one_checkpoint_is_refused_up_front(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = _python(HOLD.replace("folder / 'store'", "folder / 'a' / 'store'"), tmp_path, stdin=subprocess.PIPE)
    try:
        assert first.stdout.readline() == "holding\n"
        second = _python(SECOND.replace("folder / 'store'", "folder / 'b' / 'store'"), tmp_path)
        out, err = second.communicate(timeout=120)
        assert second.returncode == 2 and out == "", (out, err)
        assert err.count("\n") == 1 and "ckpt.pt: another train run holds this checkpoint" in err, err
    finally:
        first.communicate("\n", timeout=120)
    assert first.returncode == 0
    (tmp_path / "c").mkdir()
    after = _python(SECOND.replace("folder / 'store'", "folder / 'c' / 'store'"), tmp_path)
    out, err = after.communicate(timeout=120)
    assert after.returncode == 0 and out == "ran\n", err  # the lock went with the first run


def test_a_checkpoint_the_disk_cannot_take_is_one_line(tmp_path):
    run = _python(FULL, tmp_path)
    out, err = run.communicate(timeout=120)
    assert run.returncode == 2, err
    assert err.count("\n") == 1 and "ckpt.pt: File too large (EFBIG)" in err and "Traceback" not in err, err
    assert not (tmp_path / "ckpt.pt").exists()
