"""The command outputs the README embeds (results/dvc/*.txt) are what the commands print:
`tools/record_commands.py --check` runs each recording's commands in a real DVC repository
of the pipeline whose two data sets carry the real names (tiny data) and compares, with
measurements (numbers and their units, commit and experiment ids) excepted by pattern.
A check of the project's own documents: `make check-docs`, on a clean clone."""

from __future__ import annotations

import sys

import pytest
import yaml
from conftest import PARAMS, dvc_repo, run


@pytest.mark.slow
@pytest.mark.docs
def test_recorded_outputs_are_what_the_commands_print(tmp_path):
    root, env = dvc_repo(tmp_path / "repo", ["mnist", "fashion-mnist"])
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["convert"]["codecs"] = yaml.safe_load(PARAMS.read_text())["convert"]["codecs"]  # the README's codecs
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    run([sys.executable, "-m", "dvc", "repro", "-q"], root, env)
    run(["git", "add", "-A"], root, env)
    run(["git", "commit", "-qm", "after make repro"], root, env)
    result = run(
        [sys.executable, "tools/record_commands.py", "--check", "--repo", str(root), "--clone", str(root)],
        root,
        env,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]


def test_normalizing_keeps_words_and_drops_measurements():
    """What --check compares: a changed word is a difference, a changed figure or id is not."""
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1] / "tools"))
    from record_commands import normalized, parse

    steps = parse("$ du -sh data\n1.3G\tdata\n$ dvc exp show\n  7fa8e7d   10.018   zstd-3 \n")
    assert [command for command, _ in steps] == ["du -sh data", "dvc exp show"]
    assert normalized(steps[0][1]) == normalized("52K\tdata\n") != normalized("1.3G\tcache\n")
    assert (
        normalized(steps[1][1]) == normalized("  a9f2098      9.709   zstd-3\n") != normalized("  a9f2098  9.7  gzip\n")
    )
    assert normalized("data/shards/mnist/train: 2 shards, 47.1 MB") == normalized(
        "data/shards/mnist/train: 1 shards, 0.1 MB"
    )
    assert normalized("delta -1.5 in 100ms") == normalized("delta 2.25 in 3 ms")
    assert normalized("acceded 7fa8e7d") == ["acceded @"]  # a word of hex letters is a word; a hash is an id
    made_in_one_second = (
        "  main   10.0  zstd-3\n  ├── 8b497eb [codec-zstd-19]  8.8  zstd-19\n  └── c0f8951 [codec-gzip]  9.7  gzip\n"
    )
    swapped = (
        "  main   10.0  zstd-3\n  ├── c0f8951 [codec-gzip]  9.7  gzip\n  └── 8b497eb [codec-zstd-19]  8.8  zstd-19\n"
    )
    assert normalized(made_in_one_second) == normalized(swapped) != normalized(swapped.replace("gzip\n", "lz4\n"))
    digits_only = made_in_one_second.replace("8b497eb", "8150293").replace("c0f8951", "abcdefa")  # ids are random hex
    assert normalized(digits_only) == normalized(swapped)
    assert normalized("  ├── 8150293 [x]  8.8\n") == ["+- @ [x] #"]
