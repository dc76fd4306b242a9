"""How a library's error is quoted inside ours."""

from pathlib import Path

from pipeline.core.errors import reason


def test_reason_is_the_first_line_cut_or_the_type_when_empty():
    assert reason(ValueError("bad footer\nat byte 12")) == "bad footer"
    assert reason(OSError("x" * 300)) == "x" * 200
    assert reason(OSError("abcdef"), limit=3) == "abc"
    assert reason(KeyError()) == "KeyError"
    assert reason(OSError("\nsecond line only")) == "OSError"


def test_a_package_missing_from_the_environment_is_one_line_naming_it(tmp_path):
    """A machine set up by hand (torch alone, say) gets one line naming the package it lacks
    and exit 2, not an ImportError traceback."""
    import subprocess
    import sys

    (tmp_path / "mnist").mkdir()
    blocked = (
        "import sys; sys.modules['pyarrow'] = None; sys.argv[0] = 'pipeline'; from pipeline.cli import main; main()"
    )
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            blocked,
            "standalone-bench",
            "--mirror",
            str(tmp_path),
            "--out",
            str(tmp_path / "out"),
            "--dataset",
            "mnist",
        ],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        f"Error: this command needs the Python package 'pyarrow', which {sys.executable} "
        "lacks (make setup installs every one)"
    )


def test_a_package_missing_under_another_python_names_that_python_and_the_projects_environment(tmp_path):
    """DVC runs `python` from PATH: a shell without the venv on PATH runs another interpreter.
    The line names the interpreter that ran and how to enter the project's environment."""
    import subprocess
    import sys

    from pipeline.cli import missing_package

    root = Path(__file__).resolve().parents[1]
    probe = (
        "import sys; sys.prefix = '/usr'; sys.executable = '/usr/bin/python3'; "
        "from pipeline.cli import missing_package; print(missing_package('tqdm'))"
    )
    line = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=root).stdout.strip()
    if (root / ".venv" / "bin" / "python").exists():
        assert line == (
            "Error: this command needs the Python package 'tqdm', which /usr/bin/python3 lacks (the "
            f"project's environment has it: run `. {root / '.venv'}/bin/activate` first, or use make)"
        )
    else:
        assert line.endswith("lacks (make setup installs every one)")
    assert missing_package("x").startswith("Error: this command needs the Python package 'x', which ")
