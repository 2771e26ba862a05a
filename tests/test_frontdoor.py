"""The front door's HAProxy configuration, run by the real HAProxy on loopback (Debian 12's, 2.6,
the oldest it is written for; one test runs Debian 13's, 3.0, from the door's test image) in front
of plain HTTP servers that say who reached them: our configuration's logic alone (keys, limits,
routing by model, holding, streams' ends); real vLLM behind it is in the testbed tests."""

from __future__ import annotations

import concurrent.futures
import contextlib
import http.client
import http.server
import json
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from python_on_whales import DockerClient

from generator.stack import doorcounts, doorfiles, doorusage, frontdoor
from tests.support import images
from tests.support.door import runnable

# Below the ephemeral range (32768-60999): a retry to a closed port can never meet itself.
PORT, UPSTREAMS = 31109, (31110, 31111)
# A name HAProxy's map format would comment out and split: routed by its hex all the same.
OTHER = "# other model"
ROUTES = [
    doorfiles.Route("tiny", UPSTREAMS[0]),  # the door's own cluster's
    doorfiles.Route(OTHER, UPSTREAMS[1]),  # another cluster's on the node
]
KEY, ADMIN_KEY = "sk-alice", "the-configs-api-key"

# Debian 12's, 2.6 (make setup installs it); 3.0 runs from the door's test image (door_3).
HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
MTAIL = shutil.which("mtail") or "/usr/bin/mtail"  # Debian's, too
COUNTS_LOG, COUNTS = 31120, 31121  # mtail's: the door's lines (UDP) and Prometheus's (HTTP)


USAGE = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}


class Upstream(http.server.BaseHTTPRequestHandler):
    """Says who reached it and what it was sent, with the usage of an answer of 3 tokens for 7
    (vLLM's JSON answer); asked for a stream, vLLM's events instead: one of content (saying the
    same, but for the usage), then, as vLLM, only when the request asked for it, one of usage and
    no choices; sent in pieces cut inside the events. A request with `"cut": true` gets its first
    event, then the connection is closed (as vLLM killed between two); one with `"events": N`, N
    more events of 1 KiB of content before the rest, sent as fast as the door takes them."""

    def do_POST(self) -> None:
        body = self.body()
        sent = json.loads(body)
        said = {"port": self.server.server_port, "length": len(body),  # type: ignore[attr-defined]
                "authorization": self.headers.get("Authorization"),
                "sent": {k: v for k, v in sent.items() if k != "messages"}}  # fmt: skip
        streamed = sent.get("stream") is True
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream" if streamed else "application/json")
        if not streamed:
            out = json.dumps({**said, "usage": USAGE}).encode()
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)
            return
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        events = [{"choices": [{"delta": {"content": "hi"}}], "said": said}]
        events += [{"choices": [{"delta": {"content": "x" * 1024}}]}] * sent.get("events", 0)
        if (sent.get("stream_options") or {}).get("include_usage"):
            events.append({"choices": [], "usage": USAGE})
        out = b"".join(b"data: %s\n\n" % json.dumps(e).encode() for e in [*events, "[DONE]"])
        out = out.replace(b'"[DONE]"', b"[DONE]")
        pieces = [out[:20], out[20:-30], out[-30:], b""]  # the last event cut, too
        if sent.get("cut"):  # as vLLM killed under way: the connection closed mid-answer
            pieces = [out[: out.index(b"\n\n") + 2]]
            self.close_connection = True
        for piece in pieces:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.flush()
            time.sleep(0.05)

    def do_GET(self) -> None:
        """vLLM's health, ping and version (what the door passes on without a key), and a path
        only a key may reach."""
        said = {"path": self.path, "port": self.server.server_port}  # type: ignore[attr-defined]
        out = json.dumps(said).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def body(self) -> bytes:
        """The request's body, with a length or chunked (a body the door changed)."""
        if "Content-Length" in self.headers:
            return self.rfile.read(int(self.headers["Content-Length"]))
        assert self.headers["Transfer-Encoding"] == "chunked"
        body = b""
        while size := int(self.rfile.readline(), 16):
            body += self.rfile.read(size)
            self.rfile.readline()
        self.rfile.readline()
        return body

    def log_message(self, *args: Any) -> None:
        pass


def streamed(usage: bool | None) -> dict[str, Any]:
    """A streamed chat request: `usage`, its `stream_options.include_usage`; None, no options."""
    body = {"model": "tiny", "stream": True, "messages": []}
    return body if usage is None else {**body, "stream_options": {"include_usage": usage}}


def upstream(port: int) -> http.server.ThreadingHTTPServer:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Upstream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def rendered(folder: Path, hold: int, limits: frontdoor.Limits, counts: int | None = None) -> Path:
    """The configuration, runnable here from `folder`."""
    text = frontdoor.config(PORT, hold, ROUTES[0], limits, counts)
    keys = {"alice": KEY, doorfiles.ADMIN: ADMIN_KEY}
    return runnable(folder, text, keys, ROUTES)


@contextlib.contextmanager
def started(command: list[str], port: int, log: Path) -> Iterator[None]:
    """`command` running, once `port` on loopback takes a connection (10 s at most)."""
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=out)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            time.sleep(0.1)
        yield
    finally:
        process.terminate()
        process.wait(10)


@pytest.fixture
def door(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[None]:
    hold, limits = getattr(request, "param", (3, frontdoor.Limits(0, 0)))
    config = rendered(tmp_path, hold, limits)
    checked = subprocess.run([HAPROXY, "-c", "-f", str(config)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "WARNING" not in checked.stderr, checked.stderr  # a rule out of its order, say
    with started([HAPROXY, "-db", "-f", str(config)], PORT, tmp_path / "log"):
        yield


@pytest.fixture
def door_3(tmp_path: Path) -> Iterator[None]:
    """The same door, with `metrics` (its lines to a port nobody reads), run by HAProxy 3.0
    (Debian 13's: the testbed's door image) on the host's network, its files where they are
    here."""
    docker = DockerClient()
    config = rendered(tmp_path, 3, frontdoor.Limits(0, 0), COUNTS_LOG)
    name = f"vllm-compose-test-door-{PORT}"
    run = [*docker.client_config.docker_cmd, "run", "--rm", "--name", name, "--network", "host",
           "-v", f"{tmp_path}:{tmp_path}", images.haproxy_image(docker)]  # fmt: skip
    with started([*run, "haproxy", "-db", "-f", str(config)], PORT, tmp_path / "log"):
        try:
            yield
        finally:
            docker.container.remove(name, force=True)  # and so `docker run` ends


def send(path: str, body: dict[str, Any] | None, key: str = KEY) -> tuple[int, Any, dict[str, str]]:
    """(status, JSON body, headers); status 0 when nothing answered."""
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    request = urllib.request.Request(f"http://127.0.0.1:{PORT}{path}", data, headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.load(response), dict(response.headers)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e), dict(e.headers)
    except OSError:
        return 0, None, {}


def chat(model: str, key: str = KEY, **more: Any) -> tuple[int, Any, dict[str, str]]:
    return send("/v1/chat/completions", {"model": model, "messages": [], **more}, key)


def test_a_known_key_reaches_its_models_backend_and_the_key_stays_at_the_door(door: None) -> None:
    servers = [upstream(port) for port in UPSTREAMS]
    try:
        status, said, _ = chat(OTHER)
        assert status == 200 and said["port"] == UPSTREAMS[1]
        assert said["authorization"] is None
        # No model named: the door's own cluster, the first route, as vLLM takes it.
        status, said, _ = send("/v1/completions", {"prompt": "hi"})
        assert status == 200 and said["port"] == UPSTREAMS[0]
        # Agents' long prompts: a body of 600 kB is routed by its model all the same.
        status, said, _ = chat("tiny", padding="x" * 600_000)
        assert status == 200 and said["port"] == UPSTREAMS[0] and said["length"] > 600_000
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


def get(path: str, key: str | None = None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    request = urllib.request.Request(f"http://127.0.0.1:{PORT}{path}", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def test_health_ping_and_version_are_answered_without_a_key_and_nothing_else(door: None) -> None:
    server = upstream(UPSTREAMS[0])
    try:
        for path in ("/health", "/ping", "/version"):
            status, said = get(path)
            assert status == 200 and said == {"path": path, "port": UPSTREAMS[0]}, path
        for path in ("/metrics", "/v1/models", "/health/x", "/healthz", "/docs"):
            assert get(path)[0] == 401, path
        assert send("/ping", {}, key="")[0] != 401  # SageMaker's POST /ping, as vLLM takes it
        assert send("/health", {}, key="")[0] == 401  # a POST elsewhere: a key, as ever
        assert get("/metrics", ADMIN_KEY)[0] == 200
    finally:
        server.shutdown()
        server.server_close()
    began = time.monotonic()
    status, said = get("/health")  # vLLM down: the truth at once, not held
    assert status == 503 and said["error"]["code"] == "unavailable"
    assert time.monotonic() - began < 3


def test_an_unknown_key_gets_401_and_an_unknown_model_openais_404(door: None) -> None:
    status, said, _ = chat("tiny", key="sk-mallory")
    assert status == 401 and said["error"]["code"] == "invalid_api_key"
    status, said, _ = chat('no"such')
    assert status == 404 and said["error"]["code"] == "model_not_found"
    assert said["error"]["message"] == 'The model no"such does not exist.'
    status, said, _ = send("/v1/models", None)
    assert status == 200 and [m["id"] for m in said["data"]] == [OTHER, "tiny"]  # sorted


def test_its_log_names_who_asked_for_which_model_one_line_each_and_never_a_key(
    door: None, tmp_path: Path
) -> None:
    server = upstream(UPSTREAMS[0])
    try:
        assert chat("tiny")[0] == 200
        assert chat("tiny", key="sk-mallory")[0] == 401
        assert chat("no\nsuch 200 key=admin")[0] == 404  # a forged second line, in the model
    finally:
        server.shutdown()
        server.server_close()
    deadline = time.monotonic() + 5
    while len(lines := (tmp_path / "log").read_text().splitlines()) < 3:
        assert time.monotonic() < deadline, lines
        time.sleep(0.1)
    assert " 200 " in lines[0] and lines[0].endswith('key="alice" model="tiny" tokens=7/3'), lines
    assert " 401 " in lines[1] and lines[1].endswith('key="" model="-" tokens=-/-'), lines
    assert lines[2].endswith('key="alice" model="no\\nsuch 200 key=admin" tokens=-/-'), lines
    assert len(lines) == 3
    assert KEY not in "".join(lines) and "sk-mallory" not in "".join(lines)


@pytest.fixture
def counted(tmp_path: Path) -> Iterator[None]:
    """The door with `metrics`: its lines go to the real mtail, running our program."""
    (tmp_path / "progs").mkdir()
    (tmp_path / "progs" / "front-door.mtail").write_text(doorcounts.PROGRAM)
    config = rendered(tmp_path, 3, frontdoor.Limits(0, 0), COUNTS_LOG)
    mtail = [MTAIL, *doorcounts.arguments(COUNTS_LOG, COUNTS, str(tmp_path / "progs"))]
    with (
        started(mtail, COUNTS, tmp_path / "mtail.log"),
        started([HAPROXY, "-db", "-f", str(config)], PORT, tmp_path / "log"),
    ):
        yield


def counts(requests: int, seconds: float = 10) -> dict[str, float]:
    """mtail's front_door_* series (`name{labels}` -> value), once they count `requests`."""
    deadline, found = time.monotonic() + seconds, {}
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"http://127.0.0.1:{COUNTS}/metrics", timeout=5) as r:
            lines = r.read().decode().splitlines()
        found = {
            series: float(value)
            for series, _, value in (line.rpartition(" ") for line in lines)
            if series.startswith("front_door_")
        }
        if sum(v for k, v in found.items() if k.startswith("front_door_requests")) >= requests:
            break
        time.sleep(0.2)
    return found


def test_with_metrics_mtail_counts_requests_and_tokens_per_key_from_the_doors_lines(
    counted: None,
) -> None:
    server = upstream(UPSTREAMS[0])
    try:
        assert [chat("tiny")[0] for _ in range(2)] == [200, 200]
        assert chat("tiny", ADMIN_KEY)[0] == 200
        assert chat("tiny", key="sk-mallory")[0] == 401
        # Streamed answers: counted, with their tokens whether the request asked for its usage
        # or not (the door then asks: below), but for a request that said no.
        for usage in (None, True, False):
            assert stream(streamed(usage))[-1] == "[DONE]"
        # An answer broken off under way: counted as cut (its 200 had gone out).
        with pytest.raises(http.client.IncompleteRead):
            stream({"model": "tiny", "stream": True, "cut": True})
        # A model named to pose as the fields that follow it in the line, for the admin key.
        assert chat('x" tokens=99/99 key="admin')[0] == 404
        assert chat("/models/no-such")[0] == 404  # labelled as sent, its slashes unescaped
    finally:
        server.shutdown()
        server.server_close()
    found = counts(10)
    print(found)
    assert found['front_door_requests_total{code="200",key="alice",model="tiny"}'] == 6
    assert found['front_door_answers_cut_total{key="alice",model="tiny"}'] == 1
    assert found['front_door_prompt_tokens_total{key="alice",model="tiny"}'] == 28
    assert found['front_door_generation_tokens_total{key="alice",model="tiny"}'] == 12
    assert found['front_door_requests_total{code="200",key="admin",model="tiny"}'] == 1
    assert found['front_door_generation_tokens_total{key="admin",model="tiny"}'] == 3
    assert found['front_door_requests_total{code="401",key="",model="-"}'] == 1
    posing = [k for k in found if "99" in k]  # its own, under alice's key, and no token
    assert len(posing) == 1 and posing[0].startswith('front_door_requests_total{code="404",key="al')
    assert found['front_door_requests_total{code="404",key="alice",model="/models/no-such"}'] == 1
    assert len(found) == 10 and 99 not in found.values(), found


def test_with_metrics_a_burst_of_requests_is_counted_whole_and_soon(counted: None) -> None:
    """200 requests from 16 clients at once: every line counted within seconds (at mtail's 250 ms
    default poll, Debian's mtail reads 4 lines a second and the rest overflow its socket)."""
    server = upstream(UPSTREAMS[0])
    try:
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            codes = list(pool.map(lambda _: chat("tiny")[0], range(200)))
    finally:
        server.shutdown()
        server.server_close()
    assert codes == [200] * 200
    sent = time.monotonic()
    found = counts(200, seconds=20)
    print(f"counted {found} {time.monotonic() - sent:.1f} s after the last answer")
    assert found['front_door_requests_total{code="200",key="alice",model="tiny"}'] == 200


def stream(body: dict[str, Any], wait: float = 0) -> list[str]:
    """A streamed chat completion with alice's key: its events' data, once it has ended; its
    answer read `wait` seconds after its headers came."""
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    url = f"http://127.0.0.1:{PORT}/v1/chat/completions"
    request = urllib.request.Request(url, json.dumps(body).encode(), headers)
    with urllib.request.urlopen(request, timeout=30) as r:
        time.sleep(wait)
        answer = r.read().decode()
    assert answer.startswith("data: ") and answer.endswith("\n\n"), answer
    return [event.removeprefix("data: ") for event in answer.split("\n\n")[:-1]]


def test_with_metrics_the_door_asks_a_stream_for_its_usage_and_the_client_gets_the_stream_it_asked(
    counted: None,
) -> None:
    """vLLM sends a stream's usage only when asked; the door asks for the streams that did not
    say, and takes that event out of their answer again."""
    server = upstream(UPSTREAMS[0])
    try:
        said = {}
        for name, usage in [("plain", None), ("asked", True), ("declined", False)]:
            said[name] = stream(streamed(usage))
        status, whole, _ = chat("tiny", stream=False)
    finally:
        server.shutdown()
        server.server_close()
    sent = {name: json.loads(events[0])["said"]["sent"] for name, events in said.items()}
    assert sent["plain"]["stream_options"] == {"include_usage": True}  # asked by the door
    assert said["plain"][1:] == ["[DONE]"], said  # and its usage's event taken out
    assert sent["asked"]["stream_options"] == {"include_usage": True}
    assert json.loads(said["asked"][1]) == {"choices": [], "usage": USAGE}  # kept: it asked
    assert sent["declined"]["stream_options"] == {"include_usage": False}  # as it said
    assert said["declined"][1:] == ["[DONE]"]
    assert status == 200 and "stream_options" not in whole["sent"]  # not a stream: as it came


def test_without_metrics_a_stream_reaches_vllm_as_the_client_sent_it(door: None) -> None:
    server = upstream(UPSTREAMS[0])
    try:
        body = {"model": "tiny", "stream": True, "messages": []}
        events = stream(body)
    finally:
        server.shutdown()
        server.server_close()
    said = json.loads(events[0])["said"]
    assert said["sent"] == {"model": "tiny", "stream": True} and events[1:] == ["[DONE]"]
    assert said["length"] == len(json.dumps(body))


@pytest.mark.engine
def test_on_haproxy_3_a_stream_the_model_server_broke_off_ends_with_openais_error_and_done(
    door_3: None,
) -> None:
    """The model server closes in the middle of a stream: the client gets an error event in
    OpenAI's shape, then [DONE], and a whole end to the answer (HAProxy 2.6 cuts it: the metrics
    test above). A whole stream, and one larger than the door's
    buffer read slowly (the door can then take no more for a while, as after a close), pass on
    as they came."""
    server = upstream(UPSTREAMS[0])
    try:
        broken = stream({"model": "tiny", "stream": True, "cut": True})  # the door asks its usage
        passed = stream({**streamed(False), "cut": True})  # no usage to read
        whole = stream(streamed(None))
        slow = stream({**streamed(False), "events": LONG}, wait=2)
    finally:
        server.shutdown()
        server.server_close()
    assert json.loads(broken[0])["said"] and broken[2] == "[DONE]", broken
    assert broken[1] == doorusage.CUT.split("\n\n")[0].removeprefix("data: ")
    assert json.loads(broken[1])["error"]["code"] == "bad_gateway"
    assert passed[1:] == broken[1:], passed
    assert len(whole) == 2 and whole[1] == "[DONE]", whole  # its usage event taken out
    assert json.loads(whole[0])["said"]["sent"]["stream_options"] == {"include_usage": True}
    assert len(slow) == 2 + LONG and slow[-1] == "[DONE]"
    assert all("error" not in event for event in slow)


LONG = (
    8 * frontdoor.BUFSIZE // 1024
)  # events of 1 KiB: more than the door's and the sockets' buffers


def test_a_request_is_held_until_its_backend_answers(door: None) -> None:
    late: list[http.server.ThreadingHTTPServer] = []
    threading.Timer(1.5, lambda: late.append(upstream(UPSTREAMS[0]))).start()
    start = time.monotonic()
    try:
        status, said, _ = chat("tiny")
        assert status == 200 and said["port"] == UPSTREAMS[0]
        assert time.monotonic() - start >= 1.5
    finally:
        for server in late:
            server.shutdown()
            server.server_close()


def test_past_the_hold_a_clean_503_says_when_to_come_back(door: None) -> None:
    start = time.monotonic()
    status, said, headers = chat(OTHER)
    assert time.monotonic() - start >= 3  # the fixture's hold
    assert status == 503 and said["error"]["type"] == "server_error"
    assert headers["retry-after"] == str(frontdoor.RETRY_AFTER)


class Failing(http.server.BaseHTTPRequestHandler):
    """Answers 500 at once, as vLLM does: with its dead engine's body (`EngineDeadError`) when
    `dead`, else with another error's; notes when each request came."""

    dead: ClassVar[bool] = False
    sent: ClassVar[list[float]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        Failing.sent.append(time.monotonic())
        if Failing.dead:
            message = "EngineCore encountered an issue. See stack trace (above) for the root cause."
        else:
            message = "an error of this request"
        out = json.dumps({"error": {"message": message, "code": 500}}).encode()
        self.send_response(500)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def failing(dead: bool) -> Iterator[None]:
    """`Failing` on the port of the model OTHER, as a dead engine or not."""
    Failing.dead, Failing.sent = dead, []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", UPSTREAMS[1]), Failing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()


def test_a_dead_engines_500s_are_held_a_try_a_second_then_a_503_says_when_to_come_back(
    door: None,
) -> None:
    # A dead engine answers in a millisecond until its API server stops: tried a second apart,
    # so the hold (3 tries) lasts 3 s, not 3 ms; past it, a 503 the client may try again.
    with failing(dead=True):
        start = time.monotonic()
        status, said, headers = chat(OTHER)
        took = time.monotonic() - start
    assert status == 503 and "EngineCore" in said["error"]["message"], said
    assert headers["retry-after"] == str(frontdoor.RETRY_AFTER)
    assert took >= 3 and len(Failing.sent) == 4, (took, Failing.sent)
    gaps = [b - a for a, b in zip(Failing.sent, Failing.sent[1:], strict=False)]
    assert all(gap >= 0.9 for gap in gaps), gaps


def test_a_500_of_the_request_itself_is_answered_at_once_sent_once(door: None) -> None:
    with failing(dead=False):
        status, said, _ = chat(OTHER)
    assert status == 500 and said["error"]["message"] == "an error of this request", said
    assert len(Failing.sent) == 1, Failing.sent


def test_the_doors_own_errors_are_openais_shape_not_haproxys_html(door: None) -> None:
    closing = socket.create_server(("127.0.0.1", UPSTREAMS[1]))  # reads, answers nothing

    def close_each() -> None:
        with contextlib.suppress(OSError):
            while True:
                connection, _ = closing.accept()
                connection.recv(65536)
                connection.close()

    threading.Thread(target=close_each, daemon=True).start()
    try:
        status, said, _ = chat(OTHER)  # tried again (empty answers), then HAProxy's 502
    finally:
        closing.shutdown(socket.SHUT_RDWR)  # wakes its accept, which holds the port otherwise
        closing.close()
    assert status == 502 and said["error"]["code"] == "bad_gateway", said


def test_a_body_that_comes_too_slowly_gets_openais_408(tmp_path: Path) -> None:
    config = rendered(tmp_path, 3, frontdoor.Limits(0, 0))
    text = config.read_text().replace("timeout http-request 60s", "timeout http-request 1s")
    config.write_text(text)  # not a minute
    with (
        started([HAPROXY, "-db", "-f", str(config)], PORT, tmp_path / "log"),
        socket.create_connection(("127.0.0.1", PORT), 5) as raw,
    ):
        raw.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: door\r\nAuthorization: Bearer "
                    b"%s\r\nContent-Length: 100\r\n\r\n{\"model\":" % KEY.encode())  # fmt: skip
        raw.settimeout(10)
        answer = raw.recv(65536).decode()
    head, _, body = answer.partition("\r\n\r\n")
    assert head.startswith("HTTP/1.1 408") and "application/json" in head.lower(), answer
    assert json.loads(body)["error"]["code"] == "request_timeout"


@pytest.mark.parametrize("door", [(3, frontdoor.Limits(3, 0))], indirect=True)
def test_past_its_requests_per_minute_a_key_gets_429_and_the_admin_key_has_no_limit(
    door: None,
) -> None:
    server = upstream(UPSTREAMS[0])
    try:
        assert [chat("tiny")[0] for _ in range(3)] == [200, 200, 200]
        status, said, headers = chat("tiny")
        assert status == 429 and said["error"]["code"] == "rate_limit_exceeded"
        assert headers["retry-after"] == "60"
        assert [chat("tiny", ADMIN_KEY)[0] for _ in range(5)] == [200] * 5
    finally:
        server.shutdown()
        server.server_close()


def test_a_model_name_with_a_space_or_a_hash_is_served_and_a_control_character_refused() -> None:
    from generator import config
    from generator.base.errors import ConfigError

    base = (
        "name: c\nimage: img:1\naccelerator: none\ninterface: eth1\n"
        "nodes: [{name: a, ip: 10.0.0.1, context: a}]\nmodel: {path: /models/m}\n"
    )
    for name in ("my model", "'#m'"):
        opened = config.parse(base + f"vllm: {{served_model_name: {name}}}\n", "c.yaml")
        assert doorfiles.routes_map([frontdoor.own(opened)]).count("\n") == 1
    for name in ('"a\\0b"', '"a\\nb"', '"a\\tb"', "'-x'", "'a\u00e9'"):
        with pytest.raises(ConfigError) as refused:
            config.parse(base + f"vllm: {{served_model_name: {name}}}\n", "c.yaml")
        assert "vllm.served_model_name" in str(refused.value.problems)
    with pytest.raises(ConfigError) as host:
        config.parse(base + "vllm: {args: [--host, 0.0.0.0]}\n", "c.yaml")
    assert "front_door.enabled" in str(host.value.problems)


FAR_DOOR, HOLD = 31112, 3  # another node's door (on 127.0.0.2 of this loopback): cluster b's
DOOR_KEYS = {"a": "door-key-of-a", "b": "door-key-of-b"}  # as doorfiles.peer_key makes them


@pytest.fixture
def doors(tmp_path: Path) -> Iterator[Callable[[], contextlib.AbstractContextManager[None]]]:
    """Cluster a's door (PORT: alice's key; its model `tiny` here) and a way to start cluster
    b's, on another node (FAR_DOOR: bob's key alone; its model `far` there): each routes to the
    other's model at the other's door, and lets the other's door in by its key."""
    own, far = doorfiles.Route("tiny", UPSTREAMS[0]), doorfiles.Route("far", UPSTREAMS[1])
    configs = {}
    for name, port, mine, theirs, key in [
        ("a", PORT, own, doorfiles.Route("far", FAR_DOOR, "127.0.0.2"), KEY),
        ("b", FAR_DOOR, far, doorfiles.Route("tiny", PORT, "127.0.0.3"), "sk-bob"),
    ]:
        folder = tmp_path / name
        folder.mkdir()
        text = frontdoor.config(port, HOLD, mine, frontdoor.Limits(2, 0))
        user = "alice" if name == "a" else "bob"
        configs[name] = runnable(folder, text, {user: key, doorfiles.ADMIN: f"admin-{name}"},
                                 [mine, theirs], DOOR_KEYS, DOOR_KEYS[name])  # fmt: skip

    def far_door() -> contextlib.AbstractContextManager[None]:
        return started([HAPROXY, "-db", "-f", str(configs["b"])], FAR_DOOR, tmp_path / "b.log")

    with started([HAPROXY, "-db", "-f", str(configs["a"])], PORT, tmp_path / "a.log"):
        yield far_door


def test_a_model_behind_a_door_on_another_node_is_reached_through_this_one_with_its_key(
    doors: Callable[[], contextlib.AbstractContextManager[None]], tmp_path: Path
) -> None:
    servers = [upstream(port) for port in UPSTREAMS]
    try:
        with doors():
            status, said, _ = chat("far")  # alice's key, at a's door: b's model, at b's door
            assert status == 200 and said["port"] == UPSTREAMS[1], said
            assert said["authorization"] is None  # no key reaches vLLM, a door's neither
            assert send("/v1/models", None)[1]["data"][0]["id"] == "far"
            # b's door lets in a's door, not alice: her key is a's alone.
            request = {"model": "far", "messages": []}
            direct = urllib.request.Request(
                f"http://127.0.0.1:{FAR_DOOR}/v1/chat/completions", json.dumps(request).encode(),
                {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
            )  # fmt: skip
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(direct, timeout=10)
            assert refused.value.code == 401
            refused.value.close()
            # Past alice's 2 requests a minute at a's door; b's has no limit for a door: the
            # limits are the door's that the client asks, once.
            assert chat("far")[0] == 429
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()
    lines = (tmp_path / "b.log").read_text().splitlines()
    assert lines[0].endswith('key="door:a" model="far" tokens=7/3'), lines
    assert all(DOOR_KEYS["a"] not in line and KEY not in line for line in lines), lines


def test_a_door_on_another_node_that_is_starting_again_is_waited_for_and_its_503_is_final(
    doors: Callable[[], contextlib.AbstractContextManager[None]], tmp_path: Path
) -> None:
    # b's door down: a's holds the request, a second apart, and b's answers once it is back.
    servers = [upstream(UPSTREAMS[1])]
    with contextlib.ExitStack() as later:
        threading.Timer(1.5, lambda: later.enter_context(doors())).start()
        start = time.monotonic()
        try:
            status, said, _ = chat("far")
            assert status == 200 and said["port"] == UPSTREAMS[1], said
            assert time.monotonic() - start >= 1.5
            gone = servers.pop()
            gone.shutdown()
            gone.server_close()
            # b's vLLM gone: b's door holds the request its hold long, then says 503; a's
            # passes that on, not sending it again for another hold.
            start = time.monotonic()
            status, said, headers = send("/v1/chat/completions", {"model": "far"}, "admin-a")
            assert status == 503 and headers["retry-after"] == str(frontdoor.RETRY_AFTER)
            assert time.monotonic() - start >= HOLD
        finally:
            for server in servers:
                server.shutdown()
                server.server_close()
    # b's log: the one request its door held and answered 503; a's sent it once.
    lines = (tmp_path / "b.log").read_text().splitlines()
    assert [line for line in lines if " 503 " in line and 'key="door:a"' in line] == lines[1:2]
