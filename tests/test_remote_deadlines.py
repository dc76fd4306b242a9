"""Every read from a URL has a deadline: a store that never answers, one that trickles, and
one whose body stalls mid-way each end a fetch within a bound, with one line naming the
URL and what was slow (served by a real HTTP server on 127.0.0.1)."""

from __future__ import annotations

import http.server
import threading
import time

import pytest
from conftest import make_split, write_shards

from pipeline.shards import ShardDataset, ShardError
from pipeline.shards.remote import Deadlines

pytest.importorskip("fsspec")
pytest.importorskip("aiohttp")

DEADLINES = Deadlines(connect_s=0.5, first_byte_s=0.5, min_rate=2000, window_s=1)


class Store(http.server.ThreadingHTTPServer):
    """Serves a shard folder; `mode` makes its shard GETs stall, trickle or stop mid-way."""

    daemon_threads = True

    def __init__(self, files: dict[str, bytes]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.files, self.mode = files, "ok"


class _Handler(http.server.BaseHTTPRequestHandler):
    server: Store

    def log_message(self, *args) -> None:
        pass

    def _body(self):
        return self.server.files.get(self.path.rsplit("/", 1)[-1])

    def _failing(self) -> bool:
        """Mode "500 <name>": that file's every answer is a server error."""
        if self.server.mode == f"500 {self.path.rsplit('/', 1)[-1]}":
            self.send_error(500, "Internal Server Error")
            return True
        return False

    def do_HEAD(self) -> None:  # noqa: N802
        body = self._body()
        if self._failing():
            return
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()

    def do_GET(self) -> None:  # noqa: N802
        body, shard = self._body(), "shard-" in self.path
        if self._failing():
            return
        if body is None:
            self.send_error(404)
            return
        if shard and self.server.mode == "mute":
            time.sleep(8)
            return
        first, last = 0, len(body) - 1
        if self.headers.get("Range") and self.server.mode != "no ranges":
            a, b = self.headers["Range"].split("=")[1].split("-")
            first, last = int(a), min(int(b) if b else last, last)
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {first}-{last}/{len(body)}")
        else:
            self.send_response(200)
        part = body[first : last + 1]
        self.send_header("Content-Length", str(len(part)))
        self.end_headers()
        try:
            if shard and self.server.mode == "trickle":
                for at in range(0, len(part), 10):
                    self.wfile.write(part[at : at + 10])
                    self.wfile.flush()
                    time.sleep(0.05)
            elif shard and self.server.mode == "stall":
                self.wfile.write(part[: len(part) // 2])
                self.wfile.flush()
                time.sleep(8)
            else:
                self.wfile.write(part)
        except OSError:  # the client gave up
            pass


@pytest.fixture
def store(tmp_path):
    images, labels = make_split(100, 0)
    write_shards(images, labels, tmp_path / "s", dataset="t", split="train", samples_per_shard=50)
    server = Store({f.name: f.read_bytes() for f in (tmp_path / "s").iterdir()})
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    yield server, f"http://127.0.0.1:{server.server_address[1]}/s"
    server.shutdown()
    server.server_close()


def test_a_healthy_store_is_read(store, tmp_path):
    _, url = store
    data = ShardDataset(url, cache=tmp_path / "cache", deadlines=DEADLINES, dataset="t", split="train")
    assert [len(field) for field in data.batch([0, 99])] == [2, 2]


@pytest.mark.parametrize(
    "failing, message",
    [
        ("manifest.json", r"/s/manifest\.json: cannot read \(HTTP 500 Internal Server Error\)$"),
        (
            "shard-00001.safetensors",
            r"/s/shard-00001\.safetensors: cannot read \(HTTP 500 Internal Server Error\) \(after",
        ),
        # a shard the store does not hold (404): missing indeed
        ("", r"/s/shard-00001\.safetensors: missing from the store \(after"),
    ],
)
def test_a_server_error_is_said_as_one_not_as_a_missing_file(store, tmp_path, failing, message):
    """fsspec's HTTP store raises FileNotFoundError for any status: a 500 was "missing"."""
    server, url = store
    server.mode = f"500 {failing}"
    if not failing:
        del server.files["shard-00001.safetensors"]
    with pytest.raises(ShardError, match=message):
        data = ShardDataset(url, cache=tmp_path / "cache", deadlines=DEADLINES, dataset="t", split="train")
        data.batch([0, 99])


def test_a_static_server_without_range_requests_serves_shards_larger_than_a_read(tmp_path):
    # fsspec's ranged reads refused every shard past its first block ("doesn't appear to
    # support range requests", three tries); the whole object is read in order anyway
    images, labels = make_split(2_000, 1)
    write_shards(images, labels, tmp_path / "s", dataset="t", split="train", samples_per_shard=2_000)
    server = Store({f.name: f.read_bytes() for f in (tmp_path / "s").iterdir()})
    server.mode = "no ranges"
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/s"
        data = ShardDataset(url, cache=tmp_path / "cache", deadlines=DEADLINES, dataset="t", split="train")
        assert (tmp_path / "s" / "shard-00000.safetensors").stat().st_size > 1 << 20  # more than one read
        local = ShardDataset(tmp_path / "s", dataset="t", split="train")
        for got, wanted in zip(data.batch([0, 1_999]), local.batch([0, 1_999]), strict=True):
            assert (got == wanted).all()
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.slow  # several seconds: deadlines waited out, three tries each
@pytest.mark.parametrize(
    "mode, message",
    [
        ("mute", "no data within 1 s of asking (connect + first byte)"),
        # a streamed GET reports what has arrived: the rate is seen, not a read that never completes
        ("trickle", " bytes/s over the last 1 s, under the minimum of 2,000"),
        ("stall", " bytes/s over the last 1 s, under the minimum of 2,000"),
    ],
)
def test_a_slow_store_ends_the_fetch_within_its_deadlines(store, tmp_path, mode, message):
    server, url = store
    data = ShardDataset(url, cache=tmp_path / "cache", deadlines=DEADLINES)
    server.mode = mode
    start = time.monotonic()
    with pytest.raises(ShardError) as caught:
        data.batch([0])
    took = time.monotonic() - start
    text = str(caught.value)
    assert text.startswith(f"{url}/shard-00000.safetensors: ") and message in text and "(after 3 tries)" in text
    assert "\n" not in text
    assert took < 3 * (DEADLINES.connect_s + DEADLINES.first_byte_s) + 3, took  # three tries, each bounded
    assert not list((tmp_path / "cache" / "objects").glob("*.safetensors"))  # nothing half-fetched kept


@pytest.mark.slow  # several seconds: deadlines waited out, three tries each
def test_a_rate_under_the_minimum_is_refused(store, tmp_path):
    """Small reads that each arrive, but slower than the minimum over a window."""
    server, url = store
    slow = Deadlines(connect_s=0.5, first_byte_s=10, min_rate=10_000, window_s=0.5)
    data = ShardDataset(url, cache=tmp_path / "cache", deadlines=slow)
    import pipeline.shards.remote as remote

    original, remote.READ = remote.READ, 256
    server.mode = "trickle"
    try:
        with pytest.raises(ShardError, match=r"bytes/s over the last \d+ s, under the minimum of 10,000"):
            data.batch([0])
    finally:
        remote.READ = original
