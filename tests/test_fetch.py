import gzip
import hashlib
import io
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from pipeline.stages.fetch.settings import FetchSettings
from pipeline.stages.fetch.stage import (
    FetchError,
    FileSpec,
    _Content,
    fetch_dataset,
    load_sources,
    mirror_bases,
    parse_files,
)
from pipeline.stages.mnist import idx_bytes, read_idx

FAST = FetchSettings(timeout_s=1.0, retries=1, backoff_s=0.01)


def serve(server, prefix, tiny, override=None):
    for name, blob in tiny.blobs.items():
        server.routes[f"{prefix}/{name}"] = blob
    for name, value in (override or {}).items():
        server.routes[f"{prefix}/{name}"] = value


def assert_fetched(out, tiny):
    from pipeline.core.atomic import MARKER

    assert sorted(p.name for p in out.iterdir()) == [
        MARKER,
        "test-images.idx",
        "test-labels.idx",
        "train-images.idx",
        "train-labels.idx",
    ]
    for role, array in tiny.arrays.items():
        kind, what = role.split("_")
        np.testing.assert_array_equal(read_idx(out / f"{kind}-{what}.idx"), array)


def test_http_success(tmp_path, tiny, http_server):
    serve(http_server, "/m", tiny)
    fetch_dataset("tiny", tiny.files, [http_server.url + "/m/"], tmp_path / "raw", FAST, env={})
    assert_fetched(tmp_path / "raw", tiny)
    assert http_server.agents == {"mnist-pipeline/0.1"}  # some mirrors refuse urllib's default
    assert set(http_server.hits) == {f"/m/{name}" for name in tiny.blobs}  # one slash, each file once


def test_multi_member_gzip(tmp_path, tiny):
    """A gzip file may hold several members (as `cat a.gz b.gz` makes): all are content."""
    for name, blob in tiny.blobs.items():
        raw = gzip.decompress(blob)
        half = len(raw) // 2
        tiny.blobs[name] = gzip.compress(raw[:half], mtime=0) + gzip.compress(raw[half:], mtime=0)
    tiny.write_mirror(tmp_path / "mirror")
    fetch_dataset("tiny", tiny.files, [str(tmp_path / "mirror")], tmp_path / "raw", FAST, env={})
    assert_fetched(tmp_path / "raw", tiny)


def test_env_mirror_folder_first(tmp_path, tiny, http_server):
    """Both mirrors hold good files: the $PIPELINE_MIRROR folder must be the one used."""
    tiny.write_mirror(tmp_path / "mirror" / "tiny")
    serve(http_server, "/m", tiny)
    fetch_dataset(
        "tiny",
        tiny.files,
        [http_server.url + "/m"],
        tmp_path / "raw",
        FAST,
        env={"PIPELINE_MIRROR": str(tmp_path / "mirror") + "/"},
    )
    assert_fetched(tmp_path / "raw", tiny)
    assert sum(http_server.hits.values()) == 0


def test_mirror_order():
    assert mirror_bases("d", ["http://a", "b"], {"PIPELINE_MIRROR": " /m/ "}) == ["/m/d", "http://a", "b"]
    assert mirror_bases("d", ["http://a", "b"], {"PIPELINE_MIRROR": ""}) == ["http://a", "b"]
    assert mirror_bases("d", [], {}) == []


def test_backoff_doubles_between_retries(tmp_path, tiny, http_server, pauses, capsys):
    serve(http_server, "/m", tiny)
    http_server.fail_first["/m/train-images-idx3-ubyte.gz"] = 3
    fetch_dataset(
        "tiny",
        tiny.files,
        [http_server.url + "/m"],
        tmp_path / "raw",
        FetchSettings(timeout_s=1.0, retries=3, backoff_s=0.5),
        env={},
    )
    assert pauses == [0.5, 1.0, 2.0]
    assert http_server.hits["/m/train-images-idx3-ubyte.gz"] == 4
    err = capsys.readouterr().err
    assert "retrying in 0.5 s" in err and "retrying in 2 s" in err
    assert_fetched(tmp_path / "raw", tiny)


def test_retries_exhausted_then_next_mirror(tmp_path, tiny, http_server, pauses):
    serve(http_server, "/bad", tiny)
    serve(http_server, "/good", tiny)
    http_server.fail_first["/bad/train-images-idx3-ubyte.gz"] = 99
    fetch_dataset(
        "tiny",
        tiny.files,
        [http_server.url + "/bad", http_server.url + "/good"],
        tmp_path / "raw",
        FetchSettings(timeout_s=1.0, retries=2, backoff_s=1.0),
        env={},
    )
    assert http_server.hits["/bad/train-images-idx3-ubyte.gz"] == 3 and pauses == [1.0, 2.0]
    assert http_server.hits["/good/train-images-idx3-ubyte.gz"] == 1


def test_file_url_mirror_and_uncompressed_content(tmp_path, tiny):
    folder = tmp_path / "plain"
    folder.mkdir()
    for name, blob in tiny.blobs.items():  # a mirror may serve the raw bytes under the .gz name
        (folder / name).write_bytes(gzip.decompress(blob))
    fetch_dataset("tiny", tiny.files, [folder.as_uri()], tmp_path / "raw", FAST, env={})
    assert_fetched(tmp_path / "raw", tiny)


def test_404_then_second_mirror(tmp_path, tiny, http_server):
    serve(http_server, "/good", tiny)
    fetch_dataset(
        "tiny", tiny.files, [http_server.url + "/missing", http_server.url + "/good"], tmp_path / "raw", FAST, env={}
    )
    assert_fetched(tmp_path / "raw", tiny)
    assert http_server.hits["/missing/train-images-idx3-ubyte.gz"] == 1  # 404 is not retried


def test_transient_error_retried(tmp_path, tiny, http_server):
    serve(http_server, "/m", tiny)
    http_server.fail_first["/m/train-images-idx3-ubyte.gz"] = 1
    fetch_dataset("tiny", tiny.files, [http_server.url + "/m"], tmp_path / "raw", FAST, env={})
    assert http_server.hits["/m/train-images-idx3-ubyte.gz"] == 2
    assert_fetched(tmp_path / "raw", tiny)


def test_truncated_body(tmp_path, tiny, http_server):
    name = "train-images-idx3-ubyte.gz"
    serve(http_server, "/m", tiny, {name: ("truncate", tiny.blobs[name])})
    with pytest.raises(FetchError) as err:
        fetch_dataset("tiny", tiny.files, [http_server.url + "/m"], tmp_path / "raw", FAST, env={})
    assert f"{http_server.url}/m/{name}: truncated body" in str(err.value)
    assert not (tmp_path / "raw").exists()


@pytest.mark.parametrize("gzipped", [True, False])
def test_a_body_cut_short_without_its_length_is_tried_again(tmp_path, tiny, http_server, pauses, gzipped):
    # sent without a Content-Length, a body ends when the connection does: cut short, it
    # looked whole and was refused at once as a damaged file, never retried
    name = "train-images-idx3-ubyte.gz"
    blob = tiny.blobs[name] if gzipped else gzip.decompress(tiny.blobs[name])
    serve(http_server, "/m", tiny, {name: ("cut once, no length", blob)})
    fetch_dataset("tiny", tiny.files, [http_server.url + "/m"], tmp_path / "raw", FAST, env={})
    assert http_server.hits[f"/m/{name}"] == 2 and pauses == [FAST.backoff_s]
    assert_fetched(tmp_path / "raw", tiny)


def test_a_short_body_with_its_length_or_at_a_folder_is_not_retried(tmp_path, tiny, pauses):
    # content shorter than its IDX header states, sent whole: another try gets the same
    name = "train-images-idx3-ubyte.gz"
    tiny.blobs[name] = gzip.decompress(tiny.blobs[name])[:-100]
    tiny.write_mirror(tmp_path / "mirror")
    with pytest.raises(FetchError, match=r"content ends after [\d,]+ of the [\d,]+ bytes its IDX header states$"):
        fetch_dataset("tiny", tiny.files, [str(tmp_path / "mirror")], tmp_path / "raw", FAST, env={})
    assert pauses == []


def test_a_redirect_loop_is_one_line_of_the_mirror_list(tmp_path, tiny, http_server):
    name = "train-images-idx3-ubyte.gz"
    serve(http_server, "/m", tiny, {name: ("redirect loop", b"")})
    with pytest.raises(FetchError) as err:
        fetch_dataset("tiny", tiny.files, [http_server.url + "/m"], tmp_path / "raw", FAST, env={})
    first, *mirrors = str(err.value).splitlines()
    assert first == f"could not fetch {name} from any of 1 mirrors:"
    assert mirrors == [
        f"  - {http_server.url}/m/{name}: HTTP 302 The HTTP server returned a redirect error that would lead to an infinite loop."
    ]


def test_truncated_gzip_file(tmp_path, tiny):
    name = "train-images-idx3-ubyte.gz"
    tiny.blobs[name] = tiny.blobs[name][:-40]
    tiny.write_mirror(tmp_path / "mirror")
    with pytest.raises(FetchError, match="truncated gzip"):
        fetch_dataset("tiny", tiny.files, [str(tmp_path / "mirror")], tmp_path / "raw", FAST, env={})
    assert not (tmp_path / "raw").exists()


def test_checksum_mismatch_lists_every_mirror(tmp_path, tiny, http_server):
    name = "test-labels.idx"
    bad = tiny.arrays["test_labels"].copy()
    bad[0] = (bad[0] + 1) % 10
    from pipeline.stages.mnist import idx_bytes

    corrupt = gzip.compress(idx_bytes(bad))
    serve(http_server, "/m", tiny, {"t10k-labels-idx1-ubyte.gz": corrupt})
    from pipeline.core.atomic import MARKER

    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "stale.idx").write_bytes(b"old")
    (tmp_path / "raw" / MARKER).write_text("an earlier run's\n")  # the stage's own earlier output
    with pytest.raises(FetchError) as err:
        fetch_dataset(
            "tiny", tiny.files, [http_server.url + "/m", str(tmp_path / "empty")], tmp_path / "raw", FAST, env={}
        )
    message = str(err.value)
    expected = tiny.files["test_labels"]["sha256"]
    actual = hashlib.sha256(idx_bytes(bad)).hexdigest()
    assert "could not fetch t10k-labels-idx1-ubyte.gz from any of 2 mirrors" in message
    lines = message.splitlines()  # one line per mirror, each its own
    assert len(lines) == 3 and all(line.startswith("  - ") and "XX" not in line for line in lines[1:])
    assert f"expected {expected}, got {actual}" in message
    assert f"{tmp_path / 'empty'}/t10k-labels-idx1-ubyte.gz: not found" in message
    # The old output is untouched and no partial file of the new one is left anywhere.
    assert sorted(p.name for p in (tmp_path / "raw").iterdir()) == [MARKER, "stale.idx"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    assert not (tmp_path / "raw" / name).exists()


def test_stall_honours_timeout(tmp_path, tiny, http_server, capsys):
    """The slow mirror stalls 3 s mid-body, then would finish: with a 0.5 s timeout the
    file must come from the next mirror (without the timeout it would come from /slow)."""
    name = "train-labels-idx1-ubyte.gz"
    serve(http_server, "/slow", tiny, {name: ("stall", tiny.blobs[name])})
    serve(http_server, "/fast", tiny)
    settings = FetchSettings(timeout_s=1.0, retries=0, backoff_s=0)
    fetch_dataset(
        "tiny", tiny.files, [http_server.url + "/slow", http_server.url + "/fast"], tmp_path / "raw", settings, env={}
    )
    assert f"train-labels.idx <- {http_server.url}/fast/{name}" in capsys.readouterr().err
    assert http_server.hits[f"/slow/{name}"] == 1
    assert_fetched(tmp_path / "raw", tiny)


def test_stall_reported(tmp_path, tiny, http_server):
    name = "train-labels-idx1-ubyte.gz"
    serve(http_server, "/slow", tiny, {name: ("stall", tiny.blobs[name])})
    with pytest.raises(FetchError, match=r"read timed out after 10 bytes \(gave up after 1 tries\)"):
        fetch_dataset(
            "tiny",
            tiny.files,
            [http_server.url + "/slow"],
            tmp_path / "raw",
            FetchSettings(timeout_s=1.0, retries=0),
            env={},
        )


def test_connection_refused_is_reported(tmp_path, tiny):
    with pytest.raises(FetchError, match="cannot connect"):
        fetch_dataset(
            "tiny",
            tiny.files,
            ["http://127.0.0.1:9"],
            tmp_path / "raw",
            FetchSettings(timeout_s=0.5, retries=0),
            env={},
        )


def test_files_block_validated():
    with pytest.raises(ValueError, match="64 hex digits"):
        parse_files({"train_csv": {"name": "a", "sha256": "xyz"}})
    with pytest.raises(ValueError, match="either the four IDX files"):
        parse_files({"train_images": {"name": "a", "sha256": "0" * 64}})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- a\n- b\n", r"no data set 'tiny' with a `files` mapping \(known: \[\]\)"),
        ("other: {files: {}}\n", r"no data set 'tiny' with a `files` mapping \(known: \['other'\]\)"),
        ("tiny: {mirrors: [a]}\n", r"no data set 'tiny' with a `files` mapping"),
        ("tiny: {files: [a]}\n", r"no data set 'tiny' with a `files` mapping"),
        ("tiny: {files: {}, mirrors: a-string}\n", r"tiny.mirrors must be a list of URLs or folders"),
        ("tiny: {files: {}, mirrors: [a, 3]}\n", r"tiny.mirrors must be a list of URLs or folders"),
        ("tiny: [unclosed\n", r"not valid YAML"),
    ],
)
def test_sources_file_checked(tmp_path, text, message):
    (tmp_path / "sources.yaml").write_text(text)
    with pytest.raises(FetchError, match=message):
        load_sources(tmp_path / "sources.yaml", "tiny")


def test_sources_file_read(tmp_path):
    digest = "0" * 64
    files = {"train_csv": {"name": "a.csv", "sha256": digest}, "test_csv": {"name": "b.csv", "sha256": digest}}
    other = {"train_csv": {"name": "c.csv", "sha256": digest, "bytes": 10}, "test_csv": {"name": "d", "sha256": digest}}
    (tmp_path / "sources.yaml").write_text(
        yaml.safe_dump({"tiny": {"files": files, "mirrors": ["http://m/x", "/data"]}, "small": {"files": other}})
    )
    assert load_sources(tmp_path / "sources.yaml", "tiny") == (files, ["http://m/x", "/data"])
    assert load_sources(tmp_path / "sources.yaml", "small") == (other, [])
    with pytest.raises(FetchError, match="no such sources file"):
        load_sources(tmp_path / "none.yaml", "tiny")


@pytest.mark.parametrize(("status", "retried"), [(500, True), (429, True), (499, False), (403, False)])
def test_server_errors_and_rate_limits_are_retried_client_errors_are_not(tmp_path, tiny, http_server, status, retried):
    name = "train-images-idx3-ubyte.gz"
    serve(http_server, "/m", tiny)
    serve(http_server, "/other", tiny)
    http_server.fail_first[f"/m/{name}"] = 1
    http_server.fail_status = status
    fetch_dataset(
        "tiny", tiny.files, [http_server.url + "/m", http_server.url + "/other"], tmp_path / "raw", FAST, env={}
    )
    assert http_server.hits[f"/m/{name}"] == (2 if retried else 1)
    assert http_server.hits.get(f"/other/{name}", 0) == (0 if retried else 1)
    assert_fetched(tmp_path / "raw", tiny)


def test_a_last_try_cut_by_the_deadline_says_so_not_the_timeout(tmp_path, tiny, http_server, pauses):
    # the last try waits what is left of fetch.deadline_s; its line gave that as if it were
    # the timeout ("no answer within 1.39026 s")
    name = "train-labels-idx1-ubyte.gz"
    serve(http_server, "/m", tiny, {name: ("mute", tiny.blobs[name])})
    settings = FetchSettings(timeout_s=2.0, retries=0, deadline_s=1.0)
    with pytest.raises(FetchError) as err:
        fetch_dataset("tiny", tiny.files, [http_server.url + "/m"], tmp_path / "raw", settings, env={})
    assert re.search(r": no answer within [\d.]+ s, what was left of fetch.deadline_s \(connecting", str(err.value))


def test_body_without_content_length(tmp_path, tiny, http_server):
    """A server may send no Content-Length and end the body by closing: the file is whole."""
    serve(http_server, "/m", tiny, {name: ("no length", blob) for name, blob in tiny.blobs.items()})
    fetch_dataset("tiny", tiny.files, [http_server.url + "/m"], tmp_path / "raw", FAST, env={})
    assert_fetched(tmp_path / "raw", tiny)


def test_server_that_never_answers(tmp_path, tiny, http_server):
    name = "train-labels-idx1-ubyte.gz"
    serve(http_server, "/m", tiny, {name: ("mute", tiny.blobs[name])})
    with pytest.raises(FetchError) as err:
        fetch_dataset(
            "tiny",
            tiny.files,
            [http_server.url + "/m"],
            tmp_path / "raw",
            FetchSettings(timeout_s=1.0, retries=0),
            env={},
        )
    said = f"{http_server.url}/m/{name}: no answer within 1 s (connecting, or waiting for its response) (gave up after 1 tries)"
    assert said in str(err.value)


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_connection_refused_names_the_reason(tmp_path, tiny, scheme):
    """https goes over the network like http (not to a local path called 'https:...')."""
    with pytest.raises(FetchError) as err:
        fetch_dataset(
            "tiny",
            tiny.files,
            [f"{scheme}://127.0.0.1:9"],
            tmp_path / "raw",
            FetchSettings(timeout_s=0.5, retries=0),
            env={},
        )
    lines = str(err.value).splitlines()
    assert lines[0] == "could not fetch train-images-idx3-ubyte.gz from any of 1 mirrors:"
    assert lines[1] == (
        f"  - {scheme}://127.0.0.1:9/train-images-idx3-ubyte.gz: cannot connect: "
        "[Errno 111] Connection refused (gave up after 1 tries)"
    )


def test_mirror_paths_with_url_characters(tmp_path, tiny, monkeypatch):
    """A folder named with '#' (a URL fragment) or ending in 'X' is still the folder; and with
    no env given, $PIPELINE_MIRROR is read from the environment."""
    folder = tmp_path / "mirror#X"
    tiny.write_mirror(folder)
    fetch_dataset("tiny", tiny.files, [str(folder)], tmp_path / "raw", FAST, env={})
    assert_fetched(tmp_path / "raw", tiny)
    tiny.write_mirror(tmp_path / "envX" / "tiny")
    monkeypatch.setenv("PIPELINE_MIRROR", str(tmp_path / "envX") + "/")
    fetch_dataset("tiny", tiny.files, [], tmp_path / "raw2")
    assert_fetched(tmp_path / "raw2", tiny)
    assert mirror_bases("d", [], {"PIPELINE_MIRROR": "/mX/"}) == ["/mX/d"]


def test_empty_file_is_content_too(tmp_path):
    """A 0-byte file whose checksum is that of nothing is fetched (not mistaken for gzip)."""
    from pipeline.stages.fetch.stage import FileSpec, fetch_file

    (tmp_path / "mirror").mkdir()
    (tmp_path / "mirror" / "empty.csv").write_bytes(b"")
    (tmp_path / "out").mkdir()
    spec = FileSpec(role="test_csv", name="empty.csv", sha256=hashlib.sha256(b"").hexdigest())
    assert fetch_file(spec, [str(tmp_path / "mirror")], tmp_path / "out", FAST) == f"{tmp_path / 'mirror'}/empty.csv"
    assert (tmp_path / "out" / spec.stored_name).read_bytes() == b""


_DIGEST = "0123456789abcdef" * 4


def test_files_block_roles_and_digests():
    csv = parse_files(
        {"train_csv": {"name": "a.csv", "sha256": _DIGEST}, "test_csv": {"name": "b.csv", "sha256": _DIGEST}}
    )
    assert [(s.role, s.name) for s in csv] == [("train_csv", "a.csv"), ("test_csv", "b.csv")]
    assert (
        parse_files(
            {"test_csv": {"name": "b", "sha256": _DIGEST.upper()}, "train_csv": {"name": "a", "sha256": _DIGEST}}
        )[0].sha256
        == _DIGEST
    )
    for bad in (_DIGEST[:-1], "g" * 64, _DIGEST + "0"):
        with pytest.raises(ValueError, match="64 hex digits"):
            parse_files({"train_csv": {"name": "a", "sha256": bad}, "test_csv": {"name": "b", "sha256": _DIGEST}})


@pytest.mark.parametrize(
    ("entry", "stored"),
    [
        ({"name": "x" * 255, "sha256": _DIGEST}, ("x" * 255, None)),  # the longest file name
        ({"name": "X.csv", "sha256": _DIGEST, "bytes": 0}, ("X.csv", 0)),  # an empty file, pinned as such
        ({"name": "b", "sha256": _DIGEST, "bytes": 1 << 32}, ("b", 1 << 32)),  # the largest size a file may state
    ],
)
def test_a_files_entry_at_each_limit_is_kept_as_written(entry, stored):
    """Name and size at their limits are accepted, and the size is kept for the download to
    be held to."""
    specs = parse_files({"train_csv": entry, "test_csv": {"name": "t.csv", "sha256": _DIGEST}})
    assert (specs[0].name, specs[0].bytes) == stored


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"name": "a", "sha256": _DIGEST, "size": 3}, r"expected \{name: \.\.\., sha256: \.\.\.\}"),
        ({"name": "a", "sha256": _DIGEST, "bytes": "12"}, r"bytes must be an integer in 0\.\.4,294,967,296, got '12'"),
        ({"name": "a", "sha256": _DIGEST, "bytes": True}, r"bytes must be an integer .* got True"),
        ({"name": "a", "sha256": _DIGEST, "bytes": -1}, r"bytes must be an integer .* got -1"),
        ({"name": "a", "sha256": _DIGEST, "bytes": (1 << 32) + 1}, r"bytes must be an integer .* got 4294967297"),
        ({"name": "x" * 256, "sha256": _DIGEST}, r"name must be a plain file name"),
        ({"name": "", "sha256": _DIGEST}, r"name must be a plain file name"),
        ({"name": ".", "sha256": _DIGEST}, r"name must be a plain file name"),
        ({"name": "..", "sha256": _DIGEST}, r"name must be a plain file name"),
        ({"name": "a/b", "sha256": _DIGEST}, r"name must be a plain file name"),
        ({"name": "a\\b", "sha256": _DIGEST}, r"name must be a plain file name"),
        ({"name": "a\0b", "sha256": _DIGEST}, r"name must be a plain file name"),
    ],
)
def test_a_files_entry_past_a_limit_is_refused_by_role(entry, message):
    """sources.yaml is input: an unknown key, a size that is not a plain integer in range, or a
    name that is not one plain file name is refused, naming the file's role."""
    with pytest.raises(ValueError, match=rf"^sources: file train_csv: {message}"):
        parse_files({"train_csv": entry, "test_csv": {"name": "t.csv", "sha256": _DIGEST}}, origin="sources: ")


@pytest.mark.parametrize("gzipped", [False, True])
def test_content_fed_a_byte_at_a_time_is_the_file(gzipped):
    """However the reads split it, what is written is the file's bytes, hashed, with the IDX
    header checked once it is whole; a labels file's bound is its header's 8 bytes and a byte
    per label of the split's rows."""
    raw = idx_bytes(np.arange(5, dtype=np.uint8))
    spec = FileSpec(role="train_labels", name="labels.gz", sha256=hashlib.sha256(raw).hexdigest())
    assert spec.budget({"train": 5}) == len(raw) == 13
    wire = gzip.compress(raw, mtime=0) if gzipped else raw
    out = io.BytesIO()
    content = _Content(spec, out, spec.budget({"train": 5}), {"train": 5})
    for at in range(len(wire)):
        content.feed(wire[at : at + 1])
    content.finish()
    assert out.getvalue() == raw and content.written == len(raw) and content.digest.hexdigest() == spec.sha256


def test_fetch_settings_are_one_type_whose_rule_between_keys_is_the_params_files():
    """The params check refuses pauses past the deadline (one line, by key); the fetcher
    itself takes such settings (it stops a pause that would pass the deadline)."""
    from pipeline.core.params import ParamsError, validated

    good = {"timeout_s": 5, "retries": 2, "backoff_s": 1, "deadline_s": 60}
    assert validated(FetchSettings, good, "fetch", Path("params.yaml")) == FetchSettings(5, 2, 1, 60)
    with pytest.raises(ParamsError, match=r"fetch: the pauses between retries .* exceed deadline_s \(5 s\)"):
        validated(FetchSettings, {**good, "retries": 5, "backoff_s": 1.5, "deadline_s": 5}, "fetch", Path("p"))
    with pytest.raises(ParamsError, match=r"fetch.retries: Input should be less than or equal to 10"):
        validated(FetchSettings, {**good, "retries": 11}, "fetch", Path("p"))
    assert FetchSettings(timeout_s=1, retries=5, backoff_s=1.5, deadline_s=5).retries == 5  # built, not checked
