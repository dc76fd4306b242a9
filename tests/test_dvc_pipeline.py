"""End to end: the real dvc.yaml in a temporary git repo, on a tiny generated mirror."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import dvc_repo, run

ROOT = Path(__file__).resolve().parents[1]
# Every test here runs real `dvc` commands over the pipeline (the whole of it in the first),
# training included: slow, and the fast loop `pytest -m "not slow"` leaves them out.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """A git + DVC repo holding the project's pipeline, and an environment to run it in."""
    return dvc_repo(tmp_path_factory.mktemp("repo"), ["tiny", "tiny-b"])


def dvc(repo, *args, check=True):
    root, env = repo
    return run([sys.executable, "-m", "dvc", *args], root, env, check=check)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_fetch_and_csv_then_noop(repo):
    root, _ = repo
    out = dvc(repo, "repro", "csv@tiny", "csv@tiny-b").stdout
    assert "Running stage 'fetch@tiny'" in out and "Running stage 'csv@tiny-b'" in out
    header = (root / "data/csv/tiny/train.csv").read_text().splitlines()
    assert len(header) == 65 and header[0].startswith("label,pixel1,pixel2")
    assert len((root / "data/csv/tiny/test.csv").read_text().splitlines()) == 33
    again = dvc(repo, "repro", "csv@tiny", "csv@tiny-b").stdout
    assert "Running stage" not in again and "didn't change" in again


def test_corrupt_mirror_fails_cleanly(repo, tmp_path):
    root, env = repo
    mirror = Path(env["PIPELINE_MIRROR"])
    broken = tmp_path / "broken"
    shutil.copytree(mirror, broken)
    blob = broken / "tiny" / "train-images-idx3-ubyte.gz"
    blob.write_bytes(blob.read_bytes()[:-100])
    result = run(
        [sys.executable, "-m", "pipeline", "fetch", "tiny", "--out", str(tmp_path / "raw")],
        root,
        {**env, "PIPELINE_MIRROR": str(broken)},
        check=False,
    )
    assert result.returncode == 2  # bad input
    assert "could not fetch train-images-idx3-ubyte.gz" in result.stderr
    assert "truncated gzip" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "raw").exists()


def ran(out: str) -> set[str]:
    """The stages `dvc repro` ran, from its output."""
    return {line.split("'")[1] for line in out.splitlines() if line.startswith("Running stage")}


def widest(text: str) -> int:
    return max(len(line) for line in text.splitlines())


def test_full_pipeline_then_codec_change_reruns_no_training(repo):
    root, env = repo
    dvc(repo, "repro")
    again = dvc(repo, "repro").stdout  # only the machine's fingerprint is taken again: unchanged, so nothing runs
    assert ran(again) == {"machine"} and "Stage 'bench@tiny' didn't change" in again, again
    bench = json.loads((root / "metrics/bench/tiny.json").read_text())
    assert bench["variants"]["device"]["accuracy"] is not None
    assert {"setup_s", "wall_s"} <= set(bench["variants"]["graphed"])
    codecs = json.loads((root / "metrics/codecs.json").read_text())
    assert set(codecs["tiny-b"]["compact"]) == {"snappy", "zstd-3", "gzip", "none"}
    # this machine's report beside its data, with the committed runs; no tracked page changed
    report = (root / "data/report/results.md").read_text()
    assert "| tiny |" in report and "| `h100-80gb-hbm3` | mnist |" in report and "## `h100-80gb-hbm3`" in report
    assert (root / "data/report/img/ladder.svg").is_file() and "](../../docs/bench.md)" in report
    assert run(["git", "status", "--porcelain", "--", "README.md", "docs"], root, env).stdout == ""
    summary = json.loads((root / "metrics/summary.json").read_text())
    assert summary["tiny"]["MB"] == round(codecs["tiny"]["compact"]["zstd-3"]["train"]["MB"], 3)
    assert summary["tiny"]["epoch_s"] == min(v["train_s"] for v in bench["variants"].values() if not v["extrapolated"])
    assert summary["machine"] == bench["machine"]["name"]  # whose figures these are

    shown = dvc(repo, "metrics", "show").stdout  # one row, a few columns
    assert "metrics/summary.json" in shown and "codecs.json" not in shown and "tiny-b.MB" in shown
    assert "machine" in shown and bench["machine"]["name"] in shown
    assert widest(shown) <= 120, shown
    run(["git", "add", "-A"], root, env)
    run(["git", "commit", "-qm", "baseline"], root, env)

    params = yaml.safe_load((root / "params.yaml").read_text())
    params["convert"]["codec"] = "none"
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    out = dvc(repo, "repro").stdout
    # the params check (params.yaml changed), then the shards and the summary: no training reran
    assert ran(out) == {"params", "machine", "shard@tiny", "shard@tiny-b", "summary"}, out
    diff = dvc(repo, "metrics", "diff").stdout
    size = [line for line in diff.splitlines() if " tiny.MB " in line]
    assert len(size) == 1 and widest(diff) <= 120, diff  # the size change: one row per data set
    run(["git", "checkout", "--", "params.yaml", "dvc.lock", "metrics"], root, env)
    dvc(repo, "checkout")


DATA_STAGES = ["shard@tiny", "shard@tiny-b"]


def test_the_committed_state_comes_back_whole_with_no_rerun_of_the_data_stages(repo):
    """This machine's convert timings are git-tracked metrics, not cached outputs: after the data
    stages ran with other timings than the committed ones, `git checkout -- . && dvc checkout`
    brings every output back (the Parquet from the cache, byte-identical on any machine, the
    timings from git), and a repro of the data stages runs nothing."""
    root, env = repo
    dvc(repo, "repro", *DATA_STAGES)
    run(["git", "add", "-A"], root, env)
    run(["git", "commit", "-qm", "data", "--allow-empty"], root, env)
    figures = root / "metrics/convert/tiny/gzip.json"
    committed = figures.read_text()
    dvc(repo, "repro", "-f", "-s", "convert@tiny-gzip")  # new timings: another machine's, or a noisier hour
    assert run(["git", "status", "--porcelain", "--", "dvc.lock"], root, env).stdout != ""
    assert json.loads(figures.read_text())["train"]["rows"] == json.loads(committed)["train"]["rows"]
    run(["git", "checkout", "--", "."], root, env)
    dvc(repo, "checkout")
    assert figures.read_text() == committed
    again = dvc(repo, "repro", *DATA_STAGES).stdout
    assert ran(again) == set(), again
    assert run(["git", "status", "--porcelain"], root, env).stdout == ""


def outputs(root: Path, paths: list[str]) -> dict[str, dict[str, str]]:
    """{output: {file under it: sha256}}, hidden files (the writer's marker) included."""
    found = {}
    for path in paths:
        target = root / path
        files = [target] if target.is_file() else sorted(p for p in target.rglob("*") if p.is_file())
        found[path] = {str(p.relative_to(root)): digest(p) for p in files}
    return found


# A params value a stage's command refuses, each way a stage is started: `-s` (and `-f -s`) skip
# the params check, so the command itself refuses the value, after DVC decided to run the stage;
# run whole, the params check refuses it first.
CONVERT_OUTPUTS = ["data/parquet/tiny/gzip", "metrics/convert/tiny/gzip.json"]
REFUSED = [
    ({"convert": {"row_group_rows": -5}}, ["repro", "-s", "convert@tiny-gzip"], CONVERT_OUTPUTS),
    (
        {"convert": {"row_group_rows": -5}},
        ["repro", "-f", "-s", "codecs"],
        ["metrics/codecs.json", "metrics/codec_sizes.csv"],
    ),
    ({"convert": {"row_group_rows": -5}}, ["exp", "run", "-s", "convert@tiny-gzip"], CONVERT_OUTPUTS),
    ({"shard": {"samples_per_shard": 0}}, ["repro", "-s", "shard@tiny"], ["data/shards/tiny"]),
    ({"shard": {"samples_per_shard": 0}}, ["repro", "--single-item", "-f", "shard@tiny-b"], ["data/shards/tiny-b"]),
    ({"fetch": {"timeout_s": -1}}, ["repro", "-f", "-s", "fetch@tiny"], ["data/raw/tiny"]),
    ({"convert": {"row_group_rows": -5}}, ["repro", "convert@tiny-gzip"], [*CONVERT_OUTPUTS, "data/params.ok"]),
]


def test_a_value_the_command_refuses_removes_no_output_however_the_stage_is_run(repo):
    """`dvc repro -s convert@tiny-gzip` after `convert.row_group_rows: -5` deleted the stage's
    Parquet: DVC removed the outputs, then the command refused the value. Every output is
    persisted now (DVC leaves it in place) and written whole at the command's end, so each way
    of starting the stage ends in the command's one line (or the params check's) with every
    output as it was, byte for byte, and dvc.lock unchanged; a valid change still replaces an
    output whole. params.yaml, dvc.lock and the outputs are left as found."""
    root, env = repo
    dvc(repo, "repro", "codecs", "shard@tiny", "shard@tiny-b")
    params_path, lock_path = root / "params.yaml", root / "dvc.lock"
    params_text, lock = params_path.read_text(), lock_path.read_bytes()
    params = yaml.safe_load(params_text)

    def edited(change: dict) -> None:
        new = yaml.safe_load(params_text)
        for section, values in change.items():
            new[section].update(values)
        params_path.write_text(yaml.safe_dump(new, sort_keys=False))

    try:
        for change, args, paths in REFUSED:
            before = outputs(root, paths)
            edited(change)
            done = dvc(repo, *args, check=False)
            said = done.stdout + done.stderr
            assert done.returncode != 0, said
            ((section, values),) = change.items()
            key = f"{section}.{next(iter(values))}"
            ours = [line for line in said.splitlines() if line.startswith("Error: ")]
            assert len(ours) == 1 and ours[0].startswith("Error: params.yaml: ") and key in ours[0], said
            assert outputs(root, paths) == before, (args, said)
            assert lock_path.read_bytes() == lock, args
            params_path.write_text(params_text)
        # A valid change replaces the output whole: more shards, then back to one per split
        # (none of the four left over), and the same bytes and lock as before.
        assert params["shard"]["samples_per_shard"] >= 64  # one shard per split with the test's params
        before = outputs(root, ["data/shards/tiny"])
        edited({"shard": {"samples_per_shard": 16}})
        dvc(repo, "repro", "-s", "shard@tiny")
        assert len(json.loads((root / "data/shards/tiny/train/manifest.json").read_text())["shards"]) == 4
        params_path.write_text(params_text)
        dvc(repo, "repro", "-s", "shard@tiny")
        assert outputs(root, ["data/shards/tiny"]) == before
        assert lock_path.read_bytes() == lock
    finally:
        params_path.write_text(params_text)
        lock_path.write_bytes(lock)
        dvc(repo, "checkout", "params", "fetch@tiny", "convert@tiny-gzip", "shard@tiny", "shard@tiny-b")


def stale(repo) -> set[str]:
    """The stages `dvc status` says would run, the machine's fingerprint (always run) aside."""
    return set(json.loads(dvc(repo, "status", "--json").stdout)) - {"machine"}


CONVERTS = {f"convert@{name}-{codec}" for name in ("tiny", "tiny-b") for codec in ("snappy", "zstd-3", "gzip", "none")}


@pytest.mark.parametrize(
    "path, stages",
    [
        ("pipeline/stages/fetch/stage.py", {"fetch@tiny", "fetch@tiny-b"}),
        ("pipeline/stages/report/tables.py", {"report"}),
        ("pipeline/bench/runners.py", {"bench@tiny", "bench@tiny-b"}),
        ("pipeline/shards/writer.py", {"shard@tiny", "shard@tiny-b"}),
        ("pipeline/stages/shard/settings.py", {"shard@tiny", "shard@tiny-b"}),  # nothing upstream
        # the rung names, and which train the write-up's recipe (read where results are judged)
        ("pipeline/bench/variants.py", {"bench@tiny", "bench@tiny-b", "summary", "report"}),
        ("pipeline/core/codec.py", {"codecs", "summary"} | CONVERTS),  # the codec parser
        ("pipeline/cli.py", set()),  # option parsing: the paths a stage uses are in its cmd
    ],
)
def test_an_edit_makes_stale_only_the_stages_that_run_it(repo, path, stages):
    """The code lists are exact: once the `code` stage has run (with the params check before
    it, a second each), an edit to one stage's code leaves every other stage's lock entry, the
    bench's included, up to date."""
    assert stale(repo) == set(), "the pipeline must be up to date before the edit"
    lock = (repo[0] / "dvc.lock").read_bytes()
    file = repo[0] / path
    text = file.read_text()
    file.write_text(text + "\n# an edit\n")
    try:
        assert stale(repo) == {"params", "code"}
        dvc(repo, "repro", "code")
        assert stale(repo) == stages
    finally:
        file.write_text(text)
        dvc(repo, "repro", "code")
    assert stale(repo) == set() and (repo[0] / "dvc.lock").read_bytes() == lock


def test_experiments_queue_and_temp_fit_a_terminal(repo):
    """Queued and --temp experiments run (they broke on a relative site_cache_dir), and
    `dvc exp show --only-changed` after two codec experiments fits in 120 columns."""
    root, env = repo
    if not (root / "metrics/summary.json").exists():
        dvc(repo, "repro")
        run(["git", "add", "-A"], root, env)
        run(["git", "commit", "-qm", "baseline"], root, env)
    dvc(repo, "exp", "run", "--temp", "-n", "codec-gzip", "-S", "convert.codec=gzip")
    dvc(repo, "exp", "run", "--queue", "-n", "codec-snappy", "-S", "convert.codec=snappy")
    dvc(repo, "queue", "start")
    dvc(repo, "queue", "wait", "codec-snappy") if "wait" in dvc(repo, "queue", "--help").stdout else None
    shown = run(
        [sys.executable, "-m", "dvc", "exp", "show", "--only-changed", "--no-pager"], root, {**env, "COLUMNS": "120"}
    ).stdout
    assert "codec-gzip" in shown and "codec-snappy" in shown and "gzip" in shown, shown
    assert widest(shown) <= 120, shown
    assert "…" not in shown, shown  # nothing cut away


def test_plots_render_offline(repo):
    """The committed page template inlines vega: no CDN script in what `dvc plots show` writes."""
    root, _ = repo
    if not (root / "metrics/ladder.csv").exists():
        dvc(repo, "repro")
    dvc(repo, "plots", "show", "-o", "plots-out")
    page = (root / "plots-out/index.html").read_text()
    assert "cdn.jsdelivr" not in page and "<script src" not in page
    assert "vega-embed 6.29.0 sha256" in page and page.count("vegaEmbed(") >= 4  # one per plot


def test_plots_page_draws_every_chart_in_a_browser(repo):
    """`dvc plots show`'s page in a real headless Chromium: every vegaEmbed call draws its
    chart, and the page logs no error (an apostrophe in a title once broke the generated
    JavaScript: two of six charts blank, while the page's text looked right)."""
    from browser import chromium, open_pages

    if chromium() is None:
        pytest.skip("no Chromium here (apt install chromium, or set $CHROMIUM)")
    root, _ = repo
    if not (root / "metrics/ladder.csv").exists():
        dvc(repo, "repro")
    dvc(repo, "plots", "show", "-o", "plots-browser")
    index = root / "plots-browser" / "index.html"
    seen = open_pages(
        [index],
        DRAWN,
        ready=f"document.querySelectorAll('.vega-embed svg, .vega-embed canvas')"
        f".length >= {index.read_text().count('vegaEmbed(')}",
    )[index]
    calls = index.read_text().count("vegaEmbed(")
    assert seen["errors"] == [], seen["errors"]
    assert seen["result"] == {"charts": calls, "drawn": calls}, (seen["result"], calls)


# Per vega-embed container: drawn when it holds an SVG with a size or a canvas.
DRAWN = """
    const charts = [...document.querySelectorAll('.vega-embed')];
    const drawn = charts.filter(c => { const s = c.querySelector('svg');
        return (s && s.getBBox().width > 0) || c.querySelector('canvas'); });
    return {charts: charts.length, drawn: drawn.length};
"""


@pytest.fixture
def s3_server():
    """moto's S3 in server mode on 127.0.0.1 (a real HTTP endpoint, as a MinIO would be),
    with authentication on: one IAM user may use the bucket, any other key is refused.
    Yields (endpoint, {AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY})."""
    moto_server = pytest.importorskip("moto.server")
    import urllib.request

    import boto3

    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)  # the system's free port
    server.start()
    port = server.get_host_and_port()[1]
    endpoint = f"http://127.0.0.1:{port}"
    admin = {
        "endpoint_url": endpoint,
        "region_name": "us-east-1",
        "aws_access_key_id": "admin",
        "aws_secret_access_key": "admin",
    }
    boto3.client("s3", **admin).create_bucket(Bucket="pipeline")
    iam = boto3.client("iam", **admin)
    iam.create_user(UserName="dvc")
    iam.put_user_policy(
        UserName="dvc",
        PolicyName="bucket",
        PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
        ),
    )
    key = iam.create_access_key(UserName="dvc")["AccessKey"]
    # From here on every request must be signed by a known key with a policy that allows it.
    urllib.request.urlopen(
        urllib.request.Request(
            f"{endpoint}/moto-api/reset-auth", data=b"0", method="POST", headers={"Content-Type": "text/plain"}
        )
    )
    yield endpoint, {"AWS_ACCESS_KEY_ID": key["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}
    # moto's authentication switch is process-wide: off again for the servers of later tests.
    urllib.request.urlopen(
        urllib.request.Request(
            f"{endpoint}/moto-api/reset-auth", data=b"inf", method="POST", headers={"Content-Type": "text/plain"}
        )
    )
    server.stop()


def test_s3_remote_round_trip(repo, s3_server, tmp_path):
    """dvc push to S3 from one clone, dvc pull into a fresh clone: byte-identical shards and
    a following `dvc repro` runs nothing. Then wrong credentials and an unreachable endpoint:
    a clear one-line error, no traceback, and the workspace as it was."""
    pytest.importorskip("dvc_s3")
    root, env = repo
    endpoint, credentials = s3_server
    if not (root / "metrics/summary.json").exists():
        dvc(repo, "repro")
    # One attempt per request: botocore's default retries with backoff take 6 minutes to give
    # up on an unreachable endpoint (22 files); the README says so.
    s3_env = {**env, **credentials, "AWS_DEFAULT_REGION": "us-east-1", "AWS_MAX_ATTEMPTS": "1"}
    run([sys.executable, "-m", "dvc", "remote", "add", "-f", "-d", "store", "s3://pipeline/cache"], root, s3_env)
    run([sys.executable, "-m", "dvc", "remote", "modify", "store", "endpointurl", endpoint], root, s3_env)
    run(["git", "add", "-A"], root, env)
    run(["git", "commit", "-qm", "S3 remote", "--allow-empty"], root, env)
    pushed = run([sys.executable, "-m", "dvc", "push"], root, s3_env)
    assert "pushed" in pushed.stdout, pushed.stdout

    clone = tmp_path / "clone"
    run(["git", "clone", "-q", str(root), str(clone)], tmp_path, env)
    pulled = run([sys.executable, "-m", "dvc", "pull"], clone, s3_env)
    assert "Traceback" not in pulled.stderr
    for split in ("train", "test"):
        ours, theirs = root / "data/shards/tiny" / split, clone / "data/shards/tiny" / split
        assert sorted(p.name for p in ours.iterdir()) == sorted(p.name for p in theirs.iterdir())
        for file in ours.iterdir():
            assert digest(file) == digest(theirs / file.name)
    again = run([sys.executable, "-m", "dvc", "repro"], clone, s3_env)
    # the same machine: its fingerprint is unchanged; the report (not cached: rendered from files
    # git keeps) is rendered on a fresh clone's first repro
    assert ran(again.stdout) == {"machine", "report"}, again.stdout

    def workspace(folder: Path) -> list[str]:
        return sorted(
            str(p.relative_to(folder))
            for p in folder.rglob("*")
            if ".git" not in p.parts and "tmp" not in p.parts and p.name != "config.local"
        )

    wrong_key = {**s3_env, "AWS_ACCESS_KEY_ID": "AKIAWRONGWRONGWRONG0", "AWS_SECRET_ACCESS_KEY": "wrong"}
    for name, env_, local in (("wrong-key", wrong_key, None), ("unreachable", s3_env, "http://127.0.0.1:9")):
        broken = tmp_path / name
        run(["git", "clone", "-q", str(root), str(broken)], tmp_path, env)
        if local:
            run(
                [sys.executable, "-m", "dvc", "remote", "modify", "--local", "store", "endpointurl", local],
                broken,
                env_,
            )
        before = workspace(broken)
        failed = run([sys.executable, "-m", "dvc", "pull"], broken, env_, check=False)
        assert failed.returncode != 0 and "Traceback" not in failed.stderr, (name, failed.stderr)
        assert "ERROR" in failed.stderr, (name, failed.stderr)
        assert not (broken / "data" / "shards").exists() and workspace(broken) == before, name
    refused = run([sys.executable, "-m", "dvc", "push", "-r", "store"], root, wrong_key, check=False)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr


def _stage_process(session: int, words: tuple[str, ...], deadline_s: float) -> bool:
    """Whether a process of session `session` (the `dvc repro` we started, and its children)
    whose command line holds `words` (the stage's command) appears within `deadline_s`."""
    import time

    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                parts = cmdline.read_bytes().split(b"\0")
                ours = os.getsid(int(cmdline.parent.name)) == session
            except (OSError, ValueError):
                continue
            if ours and all(word.encode() in parts for word in words):
                return True
        time.sleep(0.1)
    return False


def _session_alive(session: int) -> list[int]:
    """The processes still in session `session` (the stage's DataLoader workers included)."""
    alive = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if os.getsid(int(entry.name)) == session:
                alive.append(int(entry.name))
        except (OSError, ValueError):
            continue
    return alive


def test_ctrl_c_in_the_bench_keeps_its_committed_results_and_the_lock(repo):
    """Ctrl-C (SIGINT to the whole foreground group, as a terminal sends it) while
    `bench@tiny` runs: everything stops within seconds, the committed bench results are
    still there byte for byte (DVC does not delete a persisted output; the stage writes
    beside and swaps at the end), and dvc.lock is still valid."""
    import signal
    import time

    root, env = repo
    if not (root / "metrics/bench/tiny.json").exists():
        dvc(repo, "repro")
    run(["git", "add", "-A"], root, env)
    run(["git", "commit", "-qm", "bench results", "--allow-empty"], root, env)
    results = {p: p.read_bytes() for p in (root / "metrics" / "bench").glob("*.json")}
    assert results, "no committed bench results to protect"
    lock = (root / "dvc.lock").read_bytes()
    proc = subprocess.Popen(
        [sys.executable, "-m", "dvc", "repro", "-f", "-s", "bench@tiny"],
        cwd=root,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        assert _stage_process(proc.pid, ("pipeline", "bench", "tiny"), 60), "the bench stage never started"
        time.sleep(2)  # inside the stage: its imports done, data loading or a variant training
        os.killpg(proc.pid, signal.SIGINT)
        start = time.monotonic()
        proc.wait(timeout=60)
        stopped = time.monotonic() - start
        while _session_alive(proc.pid) and time.monotonic() - start < 15:
            time.sleep(0.1)
        left = _session_alive(proc.pid)
    finally:
        if proc.poll() is None or _session_alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0 and stopped < 15, (proc.returncode, stopped)
    assert not left, f"still running 15 s after Ctrl-C: {left}"  # no worker left behind
    assert {p: p.read_bytes() for p in (root / "metrics" / "bench").glob("*.json")} == results
    assert (root / "dvc.lock").read_bytes() == lock
    assert not any(p.name.startswith(".") and p.name.endswith(".tmp") for p in (root / "metrics" / "bench").iterdir())
    dvc(repo, "status")  # every dvc command still reads the lock file
