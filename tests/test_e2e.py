"""Real vLLM (CPU build, tests/support/images.py) across two emulated nodes, deployed by `vllm-compose up`
from generated stacks: both of vLLM's multi-node backends serve the tiny model with tensor
parallelism over both nodes. The Ray backend runs vLLM's real Ray executor (the test image's
TEST-ONLY platform plugin names a Ray resource for the CPU platform, tests/support/vllm_test_platform.py)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from matplotlib import image
from python_on_whales import DockerException

from generator.stack import doorfiles, doorusage
from tests.support import clusters, faults, images
from tests.support.clusters import Pair, cli
from tests.support.load import Load
from tests.support.testbed import IFNAME, MODELS, Node, Testbed

pytestmark = pytest.mark.testbed

MODEL = f"{MODELS}/{images.MODEL}"
VLLM = "{port: 30000, max_model_len: 256, startup_timeout: 600, args: [--dtype, float32, --enforce-eager]}"
# On CPU, vLLM reads gpu_memory_utilization as the share of host memory to reserve: with Ray both
# nodes' ranks and the driver share this one machine.
VLLM_RAY = (
    "{port: 30000, max_model_len: 256, startup_timeout: 600, gpu_memory_utilization: 0.1,"
    " args: [--dtype, float32, --enforce-eager]}"
)
TWIN = "enP2p1s0f1np1"  # the DGX Spark's other port name: the worker's interface in Ray tests


@pytest.fixture
def pair(vllm_testbed: Testbed, tmp_path: Path) -> Iterator[tuple[Testbed, Path]]:
    yield vllm_testbed, tmp_path
    clusters.clean(vllm_testbed, tmp_path)


def config(
    tmp: Path,
    bed: Testbed,
    name: str,
    backend: str,
    vllm: str = VLLM,
    extra: str = "",
    interfaces: list[str] | None = None,
    door: str = "",
) -> Path:
    nodes = bed.nodes[:2]
    return clusters.write_config(
        tmp / f"{name}.yaml",
        name,
        nodes,
        images.VLLM,
        backend=backend,
        model=MODEL,
        vllm=vllm,
        extra=extra,
        interfaces=interfaces,
        door=door,
    )


def test_native_tp2_answers_is_brought_back_by_watch_after_a_killed_worker_and_down_cleans(
    pair: Pair,
) -> None:
    bed, tmp = pair
    head, worker = bed.nodes[:2]
    path = config(
        tmp, bed, "native", "native", extra=clusters.METRICS, door="requests_per_minute: 3"
    )
    # The metrics images on the head alone: `up` streams the node exporter's to the worker.
    clusters.load_metrics(bed, [head])
    with contextlib.suppress(DockerException):
        worker.docker.image.remove(images.NODE_EXPORTER, force=True)
    up = cli("up", path, cwd=tmp)
    assert up.returncode == 0, up.stderr
    assert "ready: http://192.168.200.12:30000/v1" in up.stdout
    assert f"image: {images.NODE_EXPORTER} streamed on spark2" in up.stderr
    # The start, phase by phase, read from vLLM's own log.
    phases = [line.strip() for line in up.stderr.splitlines() if "serve: spark1: " in line]
    print("\n".join(phases))
    assert any("loading weights" in line for line in phases), up.stderr
    assert phases[-1].startswith("serve: spark1: API up ("), up.stderr
    assert "serve: spark2: loading weights" in up.stderr  # the worker's phases, from its own log

    key = clusters.api_key(path)
    assert (
        "api key: generated" in up.stderr
        and (tmp / "native.state" / "api-key").stat().st_mode & 0o777 == 0o600
    )
    request = {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}
    url = "http://192.168.200.12:30000/v1/chat/completions"
    chat = ["curl", "-s", "-m", "60", url, "-H", "Content-Type: application/json"]
    refused = worker.nsexec(
        *chat, "-o", "/dev/null", "-w", "%{http_code}", "-d", json.dumps(request)
    )
    assert refused.stdout == "401"  # the API key is required
    # vLLM's health, ping and version through the door without a key, as load balancers and
    # uptime checks ask them; nothing else (its metrics, the model list) without one.
    assert [keyless(worker, p) for p in ("/health", "/ping", "/version")] == ["200"] * 3
    version = worker.nsexec("curl", "-s", "-m", "10", "http://192.168.200.12:30000/version")
    assert json.loads(version.stdout)["version"].startswith("0.32"), version.stdout
    assert [keyless(worker, p) for p in ("/metrics", "/v1/models")] == ["401"] * 2
    out = worker.nsexec(
        *chat, "-f", "-H", f"Authorization: Bearer {key}", "-d", json.dumps(request)
    )
    answer = json.loads(out.stdout)
    assert answer["object"] == "chat.completion"
    assert answer["usage"]["completion_tokens"] == 4
    assert answer["choices"][0]["message"]["content"]
    # Prometheus on the head scrapes vLLM's /metrics (with the key) and both nodes' exporters.
    served = clusters.promql(worker, "vllm:prompt_tokens_total > 0", 1)
    assert [r["metric"]["node"] for r in served] == ["spark1"]
    load = clusters.promql(worker, "node_load1", 2)
    assert sorted(r["metric"]["node"] for r in load) == ["spark1", "spark2"]
    # The front door's counts per key (mtail, from the door's log lines): the answer's 4 tokens
    # under the admin key (the config's) and its model's path, and the request refused for want
    # of a key.
    admin = clusters.promql(worker, 'front_door_generation_tokens_total{key="admin"}', 1)
    assert float(admin[0]["value"][1]) >= 4 and admin[0]["metric"]["model"] == MODEL, admin
    # Streamed answers: counted too, whether the request asked for its usage or not (the door's
    # Lua filter reads vLLM's last event; it asks vLLM for it when the request did not, and takes
    # that event out of the answer: the client gets the stream it asked for).
    events = stream(worker, key, usage=True)
    assert json.loads(events[-2][6:])["usage"]["completion_tokens"] == 4, events
    plain = stream(worker, key)
    assert plain[-1] == "data: [DONE]" and not [e for e in plain if '"usage"' in e], plain
    assert json.loads(plain[-2][6:])["choices"][0]["finish_reason"] == "length", plain
    more = f'front_door_generation_tokens_total{{key="admin"}} >= {float(admin[0]["value"][1]) + 8}'
    assert clusters.promql(worker, more, 1)
    assert clusters.promql(worker, 'front_door_requests_total{code="401"} >= 1', 1)
    # Tensor parallelism really spans the nodes: the worker's container holds rank 1 of 2.
    worker_log = worker.docker.container.logs("native-serve-1")
    assert "world_size=2 rank=1" in worker_log
    assert "tcp://192.168.200.12:29501" in worker_log
    # top: both nodes with live numbers, as JSON, and on a terminal.
    view = json.loads(cli("top", path, "--once", "--json", cwd=tmp).stdout)
    print(json.dumps(view, indent=2))
    assert [n["node"] for n in view["nodes"]] == ["spark1", "spark2"]
    for node in view["nodes"]:
        assert node["services"]["serve"].startswith("running"), node
        assert node["cpu_percent"] is not None and node["memory_bytes"] > 0, node
    endpoint = view["endpoint"]
    assert endpoint["running"] == 0 and endpoint["waiting"] == 0, endpoint
    assert endpoint["kv_cache_percent"] is not None, endpoint
    assert endpoint["generation_tokens_per_s"] is not None, endpoint
    screen = clusters.on_terminal(["top", path, "--interval", "1"], ["spark1", "spark2"], tmp)
    print(screen)
    assert "  serve " in screen and "running" in screen  # a line per service
    bench_against(path, tmp)
    check_against(path, tmp)

    keys_at_the_door(bed, path)
    assert secret_seen_in(key, tmp, [head, worker], "native") == []
    door_key = doorfiles.peer_key(key.encode())  # the door's key at other doors: not shown either
    assert secret_seen_in(door_key, tmp, [head, worker], "native", "front-door-peer-key") == []
    # The field failure, on the same group: a dead worker leaves the head up and serving nothing.
    watched_recovery(bed, path, "native", "serve")
    cut_at_the_door(bed, key)

    down = cli("down", path, cwd=tmp)
    assert down.returncode == 0, down.stderr
    assert clusters.leftovers(head, "native") == [] and clusters.leftovers(worker, "native") == []


def cut_at_the_door(bed: Testbed, key: str) -> None:
    """The head's vLLM killed in the middle of a stream: the door (HAProxy 3.0) ends the answer
    with an error event in OpenAI's shape and [DONE], and counts it as cut, under the key's
    name."""
    head, worker = bed.nodes[:2]
    request = {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}],
               "max_tokens": 200, "ignore_eos": True, "stream": True}  # fmt: skip
    url = "http://192.168.200.12:30000/v1/chat/completions"
    headers = ["-H", f"Authorization: Bearer {key}", "-H", "Content-Type: application/json"]
    curl = worker.inside("curl", "-sN", "-m", "60", url, *headers, "-d", json.dumps(request))
    # Found before the stream starts, and killed from the host: listing the head's containers or
    # `docker kill` over its context takes seconds on a loaded machine, and a fast one generates
    # the whole answer (200 tokens) sooner than that.
    pid = faults.first_process(head, "native", "serve")
    with subprocess.Popen(curl, stdout=subprocess.PIPE, text=True) as streaming:
        assert streaming.stdout is not None
        assert streaming.stdout.readline().startswith("data: ")  # under way
        os.kill(pid, signal.SIGKILL)
        rest, _ = streaming.communicate(timeout=60)
    assert streaming.returncode == 0 and rest.endswith("data: [DONE]\n\n"), rest  # a whole end
    ended = [e for e in rest.split("\n\n") if e.startswith("data: {")][-1].removeprefix("data: ")
    assert json.loads(ended) == {"error": doorusage.BROKE_OFF}, rest
    assert clusters.promql(worker, 'front_door_answers_cut_total{key="admin"} >= 1', 1)


def bench_against(path: Path, tmp: Path) -> None:
    """bench: vLLM's own benchmark against the endpoint at its default lengths, which fit the
    model's 256 tokens, prompts sharing prefixes (the prefix cache's hit rate, from vLLM's
    counters; random prompts: tests/test_replicas.py); kept as JSON and a plot. A sweep that
    cannot fit is refused before it starts; requests the real server refuses surface its own
    error."""
    sweep = ["--concurrency", "1", "--concurrency", "2", "--prompts", "4", "--prefix"]
    measured = cli("bench", path, *sweep, "--json", cwd=tmp)
    assert measured.returncode == 0, measured.stderr
    print(measured.stdout, measured.stderr)
    assert "bench: 128 prompt + 64 generated tokens per request" in measured.stderr
    saved = Path(json.loads(measured.stdout)["saved"])
    kept = json.loads(saved.read_text())
    assert kept["failed"] == 0 and kept["sweep"]["input_len"] == 128
    results = kept["results"]
    assert [r["max_concurrency"] for r in results] == [1, 2]
    for r in results:  # the server counted the tokens the client did (plus the canary's few)
        assert r["completed"] == 4 and r["failed"] == 0 and r["first_error"] is None, r
        assert r["served_output_throughput"] > 0, r
        # The prefix cache's probe (prompts sharing prefixes: vLLM's own counters).
        rate = r["prefix_cache_hit_rate"]
        assert rate is not None and 0 <= rate <= 1, r
    assert image.imread(saved.with_suffix(".png")).shape[:2] == (400, 600)
    refused = cli("bench", path, "--input-len", "250", cwd=tmp)
    assert refused.returncode == 2, refused.stderr
    assert "--input-len 250: 250 prompt + 64 generated tokens do not fit" in refused.stderr
    assert len(list(saved.parent.iterdir())) == 2  # the run and its plot, nothing more saved
    # A server that fails every request (the config, edited and not deployed, names a model it
    # does not serve): exit 1 with the server's own message; the run is kept marked failed.
    text, kept_files = path.read_text(), set(saved.parent.parent.rglob("*.json"))
    path.write_text(text.replace("vllm: {", "vllm: {served_model_name: elsewhere, ", 1))
    try:
        failed = cli("bench", path, "--concurrency", "1", "--prompts", "4", cwd=tmp)
    finally:
        path.write_text(text)
    print(failed.stderr)
    assert failed.returncode == 1, failed.stderr
    assert "elsewhere" in failed.stderr and "does not exist" in failed.stderr, failed.stderr
    assert "HTTP 404: The model `elsewhere` does not exist." in failed.stderr, failed.stderr
    [kept_failed] = set(saved.parent.parent.rglob("*.json")) - kept_files
    assert json.loads(kept_failed.read_text())["failed"] == 4


def check_against(path: Path, tmp: Path) -> None:
    """check on the real model: the first records its answers, the next matches them; an answer
    edited in the record is named with its prompt and token."""
    first = cli("check", path, cwd=tmp)
    print(first.stdout, first.stderr)
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines() == [
        "check: determinism: ok: 4 greedy prompts asked twice gave the same tokens",
        "check: golden: skipped: no answers recorded yet: these are recorded now",
        "check: context: ok: 256 tokens answered, 257 refused cleanly (400)",
    ]
    answers = tmp / "native.answers.json"
    assert f"check: golden answers recorded: {answers}" in first.stderr
    again = cli("check", path, cwd=tmp)
    assert again.returncode == 0, again.stderr
    assert "check: golden: ok: the 4 recorded answers, unchanged" in again.stdout
    kept = json.loads(answers.read_text())
    kept["answers"][1]["ids"][2] += 1
    answers.write_text(json.dumps(kept))
    changed = cli("check", path, cwd=tmp)
    print(changed.stdout, changed.stderr)
    assert changed.returncode == 1
    assert "check: golden: FAILED: prompt 2 of 4 against the recorded: token 3 differs" in (
        changed.stdout
    )
    assert "check failed: golden" in changed.stderr


def answered(node: Node, key: str) -> str:
    """The HTTP status of one chat completion sent with `key`."""
    request = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    said = node.nsexec("curl", "-s", "-m", "60", "-o", "/dev/null", "-w", "%{http_code}",
                       "http://192.168.200.12:30000/v1/chat/completions", "-H",
                       f"Authorization: Bearer {key}", "-H", "Content-Type: application/json",
                       "-d", json.dumps(request))  # fmt: skip
    return said.stdout


def keyless(node: Node, path: str) -> str:
    """The HTTP status of a GET of `path` through the door, with no key."""
    said = node.nsexec("curl", "-s", "-m", "10", "-o", "/dev/null", "-w", "%{http_code}",
                       f"http://192.168.200.12:30000{path}")  # fmt: skip
    return said.stdout


def until(node: Node, key: str, status: str) -> float:
    """Seconds until a request with `key` gets `status` (at most 10)."""
    start = time.monotonic()
    while answered(node, key) != status:
        assert time.monotonic() - start < 10, f"no {status} in 10 s"
        time.sleep(0.1)
    return time.monotonic() - start


def keys_at_the_door(bed: Testbed, path: Path) -> None:
    """A key per user before real vLLM, under the admin key's load: alice's key made and let in,
    past 3 requests a minute refused with 429, then revoked and refused; no request of the load
    failed and vLLM was not started again."""
    head, worker = bed.nodes[:2]
    serve = clusters.containers(head, path.stem)["serve"].id
    with under_load(path) as load:
        added = cli("keys", "add", path, "alice", cwd=path.parent)
        assert added.returncode == 0, added.stderr
        alice = added.stdout.strip()
        assert "alice's key: at the front door" in added.stderr, added.stderr
        print(f"alice's key let in {until(worker, alice, '200'):.2f} s after `keys add` returned")
        assert [answered(worker, alice) for _ in range(3)] == ["200", "200", "429"]
        listed = cli("keys", "ls", path, cwd=path.parent).stdout
        assert listed.splitlines()[1].split()[0] == "alice" and alice not in listed
        revoked = cli("keys", "revoke", path, "alice", cwd=path.parent)
        assert revoked.returncode == 0, revoked.stderr
        print(f"alice's key refused {until(worker, alice, '401'):.2f} s after `keys revoke`")
        assert answered(worker, clusters.api_key(path)) == "200"  # the admin key: no limit
        # Counted per key: alice's 3 answers of 2 tokens at most, then her 429s.
        query = 'sum by (code) (front_door_requests_total{key="alice",code=~"200|429"})'
        codes = {r["metric"]["code"]: r["value"][1] for r in clusters.promql(worker, query, 2)}
        assert codes.get("200") == "3" and int(codes.get("429", 0)) >= 1, codes
        tokens = clusters.promql(worker, 'front_door_generation_tokens_total{key="alice"}', 1)
        assert 3 <= int(tokens[0]["value"][1]) <= 6, tokens
    assert load.done and not [r for r in load.done if not r.ok], load.done[-3:]
    assert clusters.containers(head, path.stem)["serve"].id == serve


def watched_recovery(bed: Testbed, path: Path, project: str, service: str) -> None:
    """`up --watch` on the serving group (up changes nothing), watch at its defaults, then the
    worker's `service` container killed under load: watch names it from the engine's events and
    starts that container again at once; the group's supervisors re-form the whole group around
    it (the head's vLLM starts again too) in the same containers, and a chat completion comes
    back; Ctrl-C then stops watching (exit 130) and leaves the group as it is."""
    head, worker = bed.nodes[:2]
    watcher = clusters.Background("up", path, "--watch", cwd=path.parent)
    try:
        watcher.wait_for("ready: http://192.168.200.12:30000/v1", 900)
        watcher.wait_for("watch: ok", 120)
        time.sleep(1)  # the event streams are open by now
        before = {n.name: clusters.containers(n, project)[service].id for n in (head, worker)}
        with under_load(path) as load:
            worker.docker.container.kill(before[worker.name])
            # The kill's event, then its die's (one line, or two when the die comes later).
            watcher.wait_for(f"spark2: {service} sent signal 9 through its engine", 60)
            assert "check failed" not in watcher.output  # no check had to notice it first
            watcher.wait_for(f"watch: recovery 1/5 now: starting spark2's {service} again", 60)
            healed = "watch: healed by watch (started again) and the supervisors in"
            watcher.wait_for(healed, 900)
            back = time.monotonic()
            watcher.wait_for("watch: ok", 120)
            answered_again(load, back)
        # Through the front door: a request with no answer yet was held, not failed.
        assert [r for r in load.done if not r.ok and not r.streamed] == []
        # A stream under way when the group broke ended with vLLM's own error event, in OpenAI's
        # shape (its engine is stopped before its API server: image/stopping.py), never cut.
        streamed = [r.error for r in load.done if r.streamed and not r.ok]
        print(f"streamed requests failed: {len(streamed)}: {streamed}")
        assert all(e.startswith("an error in the stream: {") for e in streamed), streamed
        after = {n.name: clusters.containers(n, project)[service].id for n in (head, worker)}
        assert after == before  # started again, not made anew
        serve = str(head.docker.container.logs(clusters.containers(head, project)["serve"]))
        assert f"the group broke: {worker.ip}:" in serve, serve[-2000:]  # the whole group
        # Answered by the group that came back; what the tiny random model says may be empty
        # (seen once in CI: an empty text).
        answer = chat(worker, clusters.api_key(path))
        assert answer["object"] == "chat.completion" and answer["usage"]["completion_tokens"] >= 1
    finally:
        stopped = watcher.interrupt()
    assert stopped == 130, watcher.output
    assert watcher.lines[-1].endswith("watch: stopped; the group is left as it is")
    assert clusters.containers(head, project)[service].state.running  # left as it is


def test_a_late_canary_is_busy_not_broken_and_a_hung_rank_ends_a_stream_and_the_group_forms_again(
    pair: Pair,
) -> None:
    """One native group (two sequence slots, `group.hang_after: 15`), two faults in turn:
    a canary late under load is busy, not broken; then a rank that hangs breaks the group, ends
    the stream under way with vLLM's own error, and the group forms again."""
    bed, tmp = pair
    busy_vllm = VLLM.replace("--enforce-eager]", "--enforce-eager, --max-num-seqs, '2']")
    path = config(tmp, bed, "hung", "native", busy_vllm, extra="group: {hang_after: 15}")
    assert cli("up", path, cwd=tmp).returncode == 0
    late_canary_under_load(bed, path, tmp)
    hung_rank(bed, path)


def late_canary_under_load(bed: Testbed, path: Path, tmp: Path) -> None:
    """vLLM with two sequence slots, kept full by six clients sending long requests one after
    another (bounded: each at most 40 requests of 240 tokens, 180 s in all): the canary queues
    behind them and misses its 1 s deadline, but /metrics show tokens rising, so watch says busy
    and recreates nothing; once the load stops, the canary answers within 1 s again."""
    head = bed.nodes[0]
    before = clusters.containers(head, "hung")["serve"].id
    # Checks 2 s apart: each runs `docker exec`s beside serve's own healthcheck, and on two busy
    # cores an engine swamped by them is slow to list its containers.
    watcher = clusters.Background("watch", path, "--interval", "2", "--deadline", "1", cwd=tmp)
    stop = threading.Event()
    load = [threading.Thread(target=long_requests, args=(path, stop)) for _ in range(6)]
    try:
        watcher.wait_for("watch: ok", 120)
        for thread in load:
            thread.start()
        busy = watcher.wait_for("watch: busy, not broken: the canary took over 1 s;", 150)
        assert re.search(r"\d running, \d+ waiting, \+\d+ tokens in 2 s$", busy), busy
        print(busy)
        stop.set()
        for thread in load:
            thread.join(timeout=150)
        watcher.wait_for("watch: ok", 60)  # idle: the canary answers within 1 s again
    finally:
        stop.set()
        stopped = watcher.interrupt()
    assert stopped == 130, watcher.output
    recovered = [line for line in watcher.lines if "recover" in line or "failed (2/2)" in line]
    assert not recovered, watcher.output
    assert clusters.containers(head, "hung")["serve"].id == before


def hung_rank(bed: Testbed, path: Path) -> None:
    """The worker's rank stops (SIGSTOP) with a stream under way through the front door: the head's
    canary breaks the group `group.hang_after` (15 s) after vLLM last made progress, and vLLM's
    engine is stopped before its API server, so the stream ends with vLLM's own error event, in
    OpenAI's shape, and [DONE]: never a cut connection, never a hang. The group forms again and
    answers; a request sent meanwhile is held by the door, not failed."""
    head, worker = bed.nodes[:2]
    key = clusters.api_key(path)
    served = answers_counted(head)
    deadline = time.monotonic() + 60
    while answers_counted(head) == served:  # the canary's first answer arms it
        assert time.monotonic() < deadline, "the canary never answered"
        time.sleep(1)
    faults.hang_rank(worker, "hung", "native")
    request = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}
    url = "http://192.168.200.12:30000/v1/chat/completions"
    curl = ["curl", "-sN", "-m", "150", url, "-H", f"Authorization: Bearer {key}",
            "-H", "Content-Type: application/json", "-w", "\n%{http_code} %{time_total}"]  # fmt: skip
    start = time.monotonic()
    streamed = worker.nsexec(*curl, "-d", json.dumps({**request, "stream": True}), check=False)
    print(f"the stream ended after {time.monotonic() - start:.1f} s:\n{streamed.stdout}")
    serve = str(head.docker.container.logs(clusters.containers(head, "hung")["serve"]))
    print(
        "\n".join(line for line in serve.splitlines() if "vllm-compose" in line or "group" in line)
    )
    events = [line[6:] for line in streamed.stdout.splitlines() if line.startswith("data: ")]
    assert streamed.returncode == 0, streamed  # curl saw the answer end: no cut, no timeout
    assert events[-1] == "[DONE]" and json.loads(events[-2])["error"]["code"] == 500, events
    assert "the group broke: its canary failed for 15 s" in serve, serve[-3000:]
    held = worker.nsexec(*curl, "-d", json.dumps(request))  # sent while the group re-forms
    answer, status = held.stdout.rsplit("\n", 1)
    assert status.startswith("200 ") and json.loads(answer)["object"] == "chat.completion", held


def answers_counted(head: Node) -> float:
    """vLLM's count of requests it answered, read on the head behind the front door."""
    metrics = head.nsexec("curl", "-sf", "-m", "5", "http://127.0.0.1:8400/metrics").stdout
    found = re.findall(r"^vllm:request_success_total\{[^}]*\} ([0-9.e+]+)$", metrics, re.M)
    return sum(float(v) for v in found)


def long_requests(path: Path, stop: threading.Event) -> None:
    """Completions of 240 tokens (EOS ignored) one after another until `stop`: at most 40, each
    at most 120 s, none started after 180 s."""
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 240, "ignore_eos": True}
    headers = {"Authorization": f"Bearer {clusters.api_key(path)}"}
    headers["Content-Type"] = "application/json"
    url = "http://192.168.200.12:30000/v1/completions"
    until = time.monotonic() + 180
    for _ in range(40):
        if stop.is_set() or time.monotonic() > until:
            return
        request = urllib.request.Request(url, json.dumps(body).encode(), headers)
        with contextlib.suppress(OSError), urllib.request.urlopen(request, timeout=120) as answer:
            answer.read()


def chat(node: Node, key: str) -> dict[str, Any]:
    request = {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}
    url = "http://192.168.200.12:30000/v1/chat/completions"
    auth = f"Authorization: Bearer {key}"
    out = node.nsexec("curl", "-sf", "-m", "60", url, "-H", auth, "-H",
                      "Content-Type: application/json", "-d", json.dumps(request))  # fmt: skip
    return dict(json.loads(out.stdout))


def _secret_copy(path: Path) -> bool:
    """A node folder's copy of a secret (render puts it there so the folder starts by itself):
    only in secrets/, mode 0600, in a folder of mode 0700."""
    if path.parent.name != "secrets":
        return False
    assert path.stat().st_mode & 0o777 == 0o600, path
    assert path.parent.stat().st_mode & 0o777 == 0o700, path.parent
    return True


def secret_seen_in(
    secret: str, folder: Path, nodes: list[Node], project: str, kept: str = "api-key"
) -> list[str]:
    """Every place the secret must never be, that holds it: the files written beside the config
    and in its state folder (but its own file there, PROJECT.state/`kept`, and the node folders'
    secrets/ copies), `docker inspect` and the logs of the project's containers, and the command
    lines of every process in them."""
    found = [
        str(p)
        for p in folder.rglob("*")
        if p.is_file()
        and p != folder / f"{project}.state" / kept
        and not _secret_copy(p)
        and secret.encode() in p.read_bytes()
    ]
    for node in nodes:
        for service, container in clusters.containers(node, project).items():
            where = f"{node.name}/{service}"
            inspected = subprocess.run(
                ["docker", "--context", node.context, "inspect", container.id],
                capture_output=True, text=True, check=True,
            ).stdout  # fmt: skip
            if secret in inspected:
                found.append(f"{where}: docker inspect")
            if secret in node.docker.container.logs(container):
                found.append(f"{where}: logs")
            argv = node.docker.container.execute(container, ["ps", "-eo", "args"])
            if secret in str(argv):
                found.append(f"{where}: a process's command line")
    return found


def stream(node: Node, key: str, usage: bool = False) -> list[str]:
    """A streamed chat completion (`usage`: asking for it in the last event): its server-sent
    event lines."""
    request: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": 4,
        "stream": True,
    }
    if usage:
        request["stream_options"] = {"include_usage": True}
    url = "http://192.168.200.12:30000/v1/chat/completions"
    out = node.nsexec("curl", "-sfN", "-m", "60", url, "-H", f"Authorization: Bearer {key}",
                      "-H", "Content-Type: application/json", "-d", json.dumps(request))  # fmt: skip
    return [line for line in out.stdout.splitlines() if line.startswith("data: ")]


def ray_worker_env(node: Node, project: str) -> list[dict[str, str]]:
    """The per-node variables of each live vLLM Ray worker process in the node's Ray container."""
    ray = clusters.containers(node, project)["ray"]
    script = (
        'for p in $(pgrep -f "^ray::RayWorker"); do tr "\\0" "\\n" < /proc/$p/environ; echo; done'
    )
    out = node.docker.container.execute(ray, ["sh", "-c", script])
    keys = ("VLLM_HOST_IP", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
    found = []
    for block in str(out).split("\n\n"):
        env = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        if env:
            found.append({k: env.get(k, "") for k in keys})
    return found


def test_ray_tp2_serves_with_each_ranks_own_interface_and_ip_and_comes_back_after_a_kill(
    pair: Pair,
) -> None:
    """The reference path: vLLM's Ray executor (RayExecutorV2, vLLM 0.32's default), TP=2 over
    both nodes, the worker's port named otherwise than the head's, and the head with an
    "external" default route (the field failure: Ray registered that address)."""
    bed, tmp = pair
    head, worker = bed.nodes[:2]
    with bed.renamed_interface(worker, TWIN), bed.external_default_route(head):
        path = config(tmp, bed, "viaray", "ray", VLLM_RAY, interfaces=[IFNAME, TWIN])
        up = cli("up", path, cwd=tmp)
        assert up.returncode == 0, up.stderr
        assert "ready: http://192.168.200.12:30000/v1" in up.stdout
        # The worker's phases, from its Ray worker's lines in serve's log (each naming its node).
        assert "serve: spark2: loading weights" in up.stderr
        key = clusters.api_key(path)
        answer = chat(worker, key)
        assert answer["usage"]["completion_tokens"] == 4
        events = stream(worker, key)
        assert events[-1] == "data: [DONE]" and len(events) >= 3
        status = json.loads(cli("status", path, "--json", cwd=tmp).stdout)
        assert [(row["node"], row["ray_alive_at_ip"]) for row in status] == [
            ("spark1", True),
            ("spark2", True),
        ]
        # vLLM's real Ray workers, one per node, each with its own node's values.
        assert ray_worker_env(head, "viaray") == [
            {"VLLM_HOST_IP": head.ip, "NCCL_SOCKET_IFNAME": IFNAME, "GLOO_SOCKET_IFNAME": IFNAME}
        ]
        assert ray_worker_env(worker, "viaray") == [
            {"VLLM_HOST_IP": worker.ip, "NCCL_SOCKET_IFNAME": TWIN, "GLOO_SOCKET_IFNAME": TWIN}
        ]
        serve_log = head.docker.container.logs("viaray-serve-1")
        assert "RayWorkerProc" in serve_log and "world_size=2" in serve_log
        assert secret_seen_in(key, tmp, [head, worker], "viaray") == []
        # `diagnose` on the serving group: both nodes, Ray's table, the facts; no secret.
        said = cli("diagnose", path, cwd=tmp)
        assert said.returncode == 0, said.stderr
        bundle = clusters.bundled(Path(said.stdout.strip()), path)
        summary = json.loads(bundle["summary.json"])
        assert sorted(summary["ray_nodes"]) == sorted([head.ip, worker.ip])
        assert sorted(summary["preflight"]["facts"]) == ["spark1", "spark2"]
        assert "RayWorkerProc" in bundle["spark1.log"] and "spark2.containers.json" in bundle
        # The worker's Ray container killed under load: watch starts it again, the supervisors
        # re-form the group.
        watched_recovery(bed, path, "viaray", "ray")
        # And through power cuts of the worker alone and the head alone, by itself (both nodes'
        # at once, where each side starts from nothing, is cut once: native, tests/test_upgrade.py).
        faults.survives_power_cuts(bed, path, "viaray", "alone")


def test_ray_older_executor_keeps_per_node_values_too(pair: Pair) -> None:
    """vLLM's older Ray executor (RayDistributedExecutor) overwrites the workers' NCCL_* and
    VLLM_* variables with the head's unless ray_non_carry_over_env_vars.json lists them (seen
    without the list: the worker's NCCL_SOCKET_IFNAME became the head's name)."""
    bed, tmp = pair
    head, worker = bed.nodes[:2]
    with bed.renamed_interface(worker, TWIN):
        extra = 'env: {VLLM_USE_RAY_V2_EXECUTOR_BACKEND: "0"}'
        path = config(tmp, bed, "oldexec", "ray", VLLM_RAY, extra, interfaces=[IFNAME, TWIN])
        up = cli("up", path, cwd=tmp)
        assert up.returncode == 0, up.stderr
        assert chat(worker, clusters.api_key(path))["usage"]["completion_tokens"] == 4
        serve_log = head.docker.container.logs("oldexec-serve-1")
        assert "RayWorkerWrapper" in serve_log  # the older executor's worker class
        assert "Overwriting environment variable NCCL_" not in serve_log
        assert ray_worker_env(worker, "oldexec") == [
            {"VLLM_HOST_IP": worker.ip, "NCCL_SOCKET_IFNAME": TWIN, "GLOO_SOCKET_IFNAME": TWIN}
        ]


def test_ray_pipeline_parallel_stops_at_the_cpu_builds_limit(pair: Pair) -> None:
    """TP=1 x PP=2 over two nodes: Ray places one stage per node and the engine starts, but vLLM's
    CPU build sends pipeline tensors only through node-local shared memory, so the second stage
    fails the first request. A limit of the CPU build (GPUs send them over NCCL), named here."""
    bed, tmp = pair
    head = bed.nodes[0]
    vllm = VLLM_RAY.replace(
        "{port: 30000,", "{port: 30000, tensor_parallel_size: 1, pipeline_parallel_size: 2,"
    )
    path = config(tmp, bed, "viapp", "ray", vllm)
    up = cli("up", path, "--keep-on-failure", cwd=tmp)
    assert up.returncode == 1
    assert "node 'spark1': phase 'serve' failed" in up.stderr
    serve_log = head.docker.container.logs("viapp-serve-1")
    assert "Worker_PP1" in serve_log
    # Ray forwards the stage's traceback to the driver's log only while the driver lives: one
    # that exits first leaves it in the worker node's Ray logs alone.
    worker = bed.nodes[1]
    ray = clusters.containers(worker, "viapp")["ray"]
    script = "cat /tmp/ray/session_latest/logs/worker-* 2>/dev/null; true"
    ray_log = str(worker.docker.container.execute(ray, ["sh", "-c", script]))
    said = "assert self.intermediate_tensors is not None"
    assert said in serve_log or said in ray_log, str(serve_log)[-3000:]


@contextlib.contextmanager
def under_load(path: Path) -> Iterator[Load]:
    """Two clients sending chat completions to the head's front door, half streamed, for the
    block; each waits for its answer past the door's hold (120 s)."""
    url = "http://192.168.200.12:30000/v1/chat/completions"
    with Load(url, clusters.api_key(path), MODEL, timeout=150).running(2) as load:
        yield load


def answered_again(load: Load, since: float) -> None:
    """Clients are answered again after `since` (within 60 s), and every request that failed
    meanwhile failed cleanly: an error, within the clients' own timeout, never a hang."""
    deadline = time.monotonic() + 60
    while not load.answered_after(since) and time.monotonic() < deadline:
        time.sleep(1)
    assert load.answered_after(since), load.failed_after(since)[-3:]
    for r in load.failed_after(0):
        assert r.error and r.end - r.start <= load.timeout + 5, r


HOLD = """
import ray
ray.init(address="auto")

@ray.remote(num_gpus=1, resources={"node:192.168.200.13": 0.001})
class Hold:
    def ping(self):
        return 1

hold = Hold.options(name="hold", lifetime="detached").remote()
print("held", ray.get(hold.ping.remote()))
"""


def test_a_gpu_slot_held_in_ray_is_named_soon_after_vllms_first_placement_wait(pair: Pair) -> None:
    """Something else in Ray holds the worker's GPU slot (a leftover actor of an earlier driver):
    vLLM alone waits 1800 s for its placement group. `up` names the node within 10 s of vLLM's
    first wait line (which vLLM prints after 10 s)."""
    bed, tmp = pair
    head, worker = bed.nodes[:2]
    path = config(tmp, bed, "held", "ray", VLLM_RAY)
    assert cli("secrets", path, cwd=tmp).returncode == 0  # renders, and writes them on the nodes
    folders = tmp / "compose" / "held"

    def ray_up(node: Node) -> subprocess.Popen[str]:  # as `up` runs Compose (contexts.env)
        cmd = ["docker", "--context", node.context, "compose", "--env-file", "contexts.env"]
        return subprocess.Popen(
            [*cmd, "up", "-d", "--wait", "ray"], cwd=folders / node.name, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip

    starting = [ray_up(worker), ray_up(head)]
    for proc in starting:
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, out
    ray = clusters.containers(worker, "held")["ray"]
    assert "held 1" in str(worker.docker.container.execute(ray, ["python3", "-c", HOLD]))

    up = clusters.Background("up", path, cwd=tmp)
    named = up.wait_for("failed: node 'spark1': phase 'serve' failed", 300)
    named_at = time.time()
    assert up.wait(300) == 1
    assert named.strip() == (
        "failed: node 'spark1': phase 'serve' failed: Ray cannot place vLLM's workers: "
        "spark2 has 0 of 1 GPU slots free (held by another Ray job) (vLLM would wait 1800 s)"
    )
    seen = re.search(
        r"log line: .*INFO (\d\d-\d\d \d\d:\d\d:\d\d) .*Waiting for creating", up.output
    )
    assert seen, up.output
    logged = datetime.strptime(f"{datetime.now(UTC).year}-{seen.group(1)}", "%Y-%m-%d %H:%M:%S")
    after = named_at - logged.replace(tzinfo=UTC).timestamp()
    print(f"up named the node {after:.1f} s after vLLM's first placement-group wait line")
    assert after <= 10
