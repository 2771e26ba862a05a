"""The fault benchmarks' load (tests/support/load.py) against a stand-in server on loopback that
answers every chat completion at once, named as one: it tests the load's own bounds, not a model."""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
import time
from collections.abc import Iterator

import pytest

from benchmarks import common
from tests.support.load import MAX_RATE, Load


class Answers(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if body["stream"]:
            chunk = {"choices": [{"delta": {"content": "hi"}}]}
            data = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode()
            kind = "text/event-stream"
        else:
            data, kind = json.dumps({"choices": [{"message": {"content": "hi"}}]}).encode(), "json"
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_: object) -> None:
        pass


@contextlib.contextmanager
def serving(handler: type[Answers]) -> Iterator[str]:
    """The stand-in on a free loopback port, for the block: its chat completions URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/chat/completions"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def url() -> Iterator[str]:
    with serving(Answers) as found:
        yield found


def test_a_load_that_meets_its_bound_in_count_stops_and_the_wait_for_answers_names_it(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its clients stop sending at MAX_RATE requests a second of its length: a wait for steady
    answers then fails naming the load's bound, not the group (a soak's load used to stop at
    40,000 requests in silence, and its last fault read as never healed)."""
    monkeypatch.setattr(common, "FAULT_LIMIT", 15)  # the wait's own bound, here
    load = Load(url, "key", "m", seconds=0.1)  # 5 requests at most, whatever the time
    with load.running(2):
        deadline = time.monotonic() + 10
        while not load.spent() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert load.spent() == f"the load's bound of {MAX_RATE * 0.1:.0f} requests (50 a second)"
        with pytest.raises(RuntimeError, match=r"the load's bound of 5 requests .* was met"):
            common.steady(load, time.monotonic() - common.STEADY)
    assert len(load.done) <= MAX_RATE * 0.1 + 1  # and those in flight when it was met
    assert all(r.ok for r in load.done), load.done  # the stand-in answered every one


class Slow(Answers):
    def do_POST(self) -> None:
        time.sleep(0.3)
        super().do_POST()


def test_a_load_within_its_bounds_goes_on(url: str) -> None:
    load = Load(url, "key", "m", seconds=60)
    with load.running(2):
        time.sleep(1)
        assert not load.spent()
    assert sum(r.ok for r in load.done) > 10 and any(r.streamed for r in load.done)


def test_a_load_stops_at_its_bound_in_time() -> None:
    """A stand-in that takes 0.3 s an answer: the count bound (100) is out of reach in 2 s."""
    with serving(Slow) as url:
        load = Load(url, "key", "m", seconds=2)
        with load.running(1):
            time.sleep(2.5)  # its last request, sent before the bound, has ended
            assert load.spent() == "the load's bound of 2 s"
            ended = len(load.done)
            time.sleep(0.5)
            assert len(load.done) == ended  # nothing sent after it
    assert 4 <= ended <= 8, ended
