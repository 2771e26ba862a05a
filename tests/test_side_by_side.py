"""Two real vLLM clusters on the same two emulated nodes, both over Ray and TP=2 across both,
their heads on different nodes, each with its own Ray cluster, ports and API key, and each model
answered through either front door by its name (the other's door reached across the nodes). A
third config on a taken port and a fourth that would overflow the nodes' memory are refused by
preflight naming the others, a copy of a config that kept its cluster's name can neither start
nor remove it (running or stopped), and nothing of the two changes; `watch` of one recreates that
one alone; `down` of one leaves the other serving; `ls` shows exactly what runs."""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import clusters, images
from tests.support.clusters import Background, Pair, cli
from tests.support.testbed import Node, Testbed
from tests.test_e2e import MODEL

pytestmark = pytest.mark.testbed

# On CPU vLLM reads gpu_memory_utilization as the share of host memory it may take; the claims
# (generator/stack/claims.py) add up what every cluster on a node says.
VLLM = (
    "{{port: {port}, max_model_len: 256, startup_timeout: 600, gpu_memory_utilization: {memory},"
    " args: [--dtype, float32, --enforce-eager]}}"
)


@pytest.fixture
def pair(vllm_testbed: Testbed, tmp_path: Path) -> Iterator[Pair]:
    yield vllm_testbed, tmp_path
    clusters.clean(vllm_testbed, tmp_path)


def config(
    tmp: Path, name: str, nodes: list[Node], port: int | None, memory: float = 0.1, served: str = ""
) -> Path:
    """port None: the config names none, and `up` picks the first slot free on its nodes;
    `served`: the model's name for clients (default: its path)."""
    vllm = VLLM.format(port=port, memory=memory).replace("port: None, ", "")
    vllm = vllm.replace("{", f"{{served_model_name: {served}, ", 1) if served else vllm
    return clusters.write_config(
        tmp / f"{name}.yaml", name, nodes, images.VLLM, model=MODEL, vllm=vllm
    )


def chat(node: Node, head: Node, port: int, config: Path, model: str = MODEL) -> dict[str, Any]:
    request = {"model": model, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}
    return sent(node, f"http://{head.ip}:{port}/v1/chat/completions", config, request)


def sent(node: Node, url: str, config: Path, request: dict[str, Any] | None) -> dict[str, Any]:
    """The JSON answer to a POST of `request` (a GET when None), from inside `node`; any status
    (an error's body is OpenAI's error)."""
    auth = f"Authorization: Bearer {clusters.api_key(config)}"
    body = ["-H", "Content-Type: application/json", "-d", json.dumps(request)] if request else []
    out = node.nsexec("curl", "-s", "-m", "120", url, "-H", auth, *body)
    return dict(json.loads(out.stdout))


def models(node: Node, head: Node, port: int, config: Path) -> list[str]:
    return sorted(
        m["id"] for m in sent(node, f"http://{head.ip}:{port}/v1/models", config, None)["data"]
    )


def ids(nodes: list[Node], *projects: str) -> dict[str, str]:
    return {
        f"{n.name}/{p}/{s}": c.id
        for n in nodes
        for p in projects
        for s, c in clusters.containers(n, p).items()
    }


def load(url: str, config: Path, stop: threading.Event, done: list[int]) -> None:
    """Completions of 64 tokens one after another until `stop`: at most 10, none after 90 s."""
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 64, "ignore_eos": True}
    headers = {"Authorization": f"Bearer {clusters.api_key(config)}"}
    headers["Content-Type"] = "application/json"
    until = time.monotonic() + 90
    for _ in range(10):
        if stop.is_set() or time.monotonic() > until:
            return
        request = urllib.request.Request(url, json.dumps(body).encode(), headers)
        with contextlib.suppress(OSError), urllib.request.urlopen(request, timeout=120) as answer:
            answer.read()
            done.append(1)


def listed(config: Path) -> dict[str, Any]:
    found = cli("ls", config, "--json", cwd=config.parent)
    assert found.returncode == 0, found.stderr
    print(found.stdout)
    return {c["cluster"]: c for c in json.loads(found.stdout)["clusters"]}


def test_two_ray_clusters_serve_side_by_side_and_a_clash_is_refused_naming_the_other(
    pair: Pair,
) -> None:
    bed, tmp = pair
    one, two = bed.nodes[:2]
    big = config(tmp, "big", [one, two], 30000)  # TP=2 over both nodes: slot 0
    small = config(tmp, "small", [two, one], None, served="small")  # its head: two; no port named
    for path in (big, small):
        up = cli("up", path, cwd=tmp)
        assert up.returncode == 0, up.stderr
    # big holds slot 0 on both nodes: small takes slot 1, and keeps it while it runs.
    assert "ports: API port 8001 (slot 1): the slots below are taken by 'big'" in up.stderr, (
        up.stderr
    )
    checked = cli("preflight", small, cwd=tmp).stdout
    assert "beside 'big': no port or memory clash" in checked
    assert "port 8001 is this stack's front door" in checked, checked

    # Both answer at once, and a bounded load on the big one does not break the small one.
    stop, done = threading.Event(), list[int]()
    url = f"http://{one.ip}:30000/v1/completions"
    loaders = [threading.Thread(target=load, args=(url, big, stop, done)) for _ in range(2)]
    for thread in loaders:
        thread.start()
    try:
        for _ in range(3):
            assert chat(one, two, 8001, small, "small")["usage"]["completion_tokens"] == 4
            assert chat(two, one, 30000, big)["usage"]["completion_tokens"] == 4
            # One port, every model on the nodes: each door answers the other's by its name,
            # at the other's door on the other node.
            assert chat(two, one, 30000, big, "small")["usage"]["completion_tokens"] == 4
            assert chat(one, two, 8001, small)["usage"]["completion_tokens"] == 4
    finally:
        stop.set()
        for thread in loaders:
            thread.join(timeout=150)
    assert done, "the load on the big cluster completed nothing"
    assert models(two, one, 30000, big) == models(one, two, 8001, small) == sorted([MODEL, "small"])
    # small's door let big's in by its door key (no key of small's was given it), and the other
    # way round; neither logs a key.
    for node, project, door in [(two, "small", "big"), (one, "big", "small")]:
        log = str(node.docker.container.logs(clusters.containers(node, project)["front-door"]))
        assert f'key="door:{door}"' in log, log[-2000:]
        assert clusters.api_key(big) not in log and clusters.api_key(small) not in log

    # Two Ray clusters: each head's GCS (6379 for slot 0, 6380 for slot 1) knows its own nodes.
    for project, head, gcs, want in [
        ("big", one, f"{one.ip}:6379", {one.ip: 1, two.ip: 1}),
        ("small", two, f"{two.ip}:6380", {one.ip: 1, two.ip: 1}),
    ]:
        ray = clusters.containers(head, project)["ray"]
        nodes = head.docker.container.execute(
            ray, ["vllm-compose-health", "nodes", "--address", gcs]
        )
        assert json.loads(str(nodes)) == want, project
    seen = listed(big)
    assert sorted(seen) == ["big", "small"]
    assert sorted(seen["big"]["nodes"]) == ["spark1", "spark2"]
    assert sorted(seen["small"]["nodes"]) == ["spark1", "spark2"]
    assert seen["small"]["endpoint"] == f"http://{two.ip}:8001/v1"
    assert seen["small"]["front_door"] and seen["big"]["front_door"]  # each its own, on its head
    for name in ("big", "small"):  # serve's health check may not have run yet: "starting"
        health = seen[name]["health"]
        assert health == "running" or health.endswith("serve running, starting"), health

    # `watch` of small starts small's Ray again when it is killed, and small's supervisors re-form
    # it: big's containers stay as they were.
    untouched = ids([one, two], "big")
    watcher = Background("watch", small, "--interval", "2", "--backoff", "1", cwd=tmp)
    try:
        watcher.wait_for("watch: ok", 120)
        two.docker.container.kill(clusters.containers(two, "small")["ray"])
        # Its serve shares the Ray container's process namespace and exits with it.
        # Its exit may be named in the same signs as the kill, or come just after them.
        watcher.wait_for("watch: recovery 1/5 now: starting spark2's ray", 60)
        watcher.wait_for("watch: healed by watch (started again) and the supervisors in", 600)
    finally:
        watcher.interrupt()
    assert ids([one, two], "big") == untouched
    assert chat(one, two, 8001, small, "small")["usage"]["completion_tokens"] == 4

    # A third on the big one's API port, a fourth over the nodes' memory: refused, nothing moves.
    before = ids([one, two], "big", "small")
    taken = cli("up", config(tmp, "taken", [one, two], 30000), cwd=tmp)
    assert taken.returncode != 0
    assert "vllm.port 30000 is taken by cluster 'big' (vllm.port)" in taken.stderr, taken.stderr
    greedy = cli("up", config(tmp, "greedy", [one], 30002, memory=0.85), cwd=tmp)
    assert greedy.returncode != 0
    said = "GPU memory overflows: 0.85 of 'greedy' + 0.1 of 'big' + 0.1 of 'small' = 1.05 > 1"
    assert said in greedy.stderr, greedy.stderr
    # A copy of small's config under another file name, that kept the name: neither its `up`
    # (its secrets would replace small's on the node) nor its `down` touches small.
    copy = tmp / "copy.yaml"
    copy.write_text(small.read_text())
    for command in ("up", "down"):
        refused = cli(command, copy, cwd=tmp)
        assert refused.returncode != 0
        said = "the name 'small' is taken by the cluster started from small.yaml, not copy.yaml"
        assert said in refused.stderr, refused.stderr
    # Stopped, small is still not the copy's to remove (nor to start over).
    for node in (one, two):
        node.docker.container.stop(list(clusters.containers(node, "small").values()), time=5)
    refused = cli("down", copy, cwd=tmp)
    assert refused.returncode != 0 and said in refused.stderr, refused.stderr
    assert ids([one, two], "big", "small") == before
    # Nothing of theirs stays: not even the volumes their preflight's one-off containers made.
    assert [clusters.leftovers(n, p) for n in (one, two) for p in ("taken", "greedy")] == [[]] * 4

    # `down` of one leaves the other serving, its containers as they were, and its door forgets
    # the model that left.
    assert cli("down", small, cwd=tmp).returncode == 0
    assert clusters.leftovers(one, "small") == clusters.leftovers(two, "small") == []
    assert chat(two, one, 30000, big)["usage"]["completion_tokens"] == 4
    assert models(two, one, 30000, big) == [MODEL]
    gone = chat(two, one, 30000, big, "small")
    assert gone["error"]["code"] == "model_not_found", gone
    assert ids([one, two], "big") == {k: v for k, v in before.items() if "/big/" in k}
    assert sorted(listed(big)) == ["big"]
