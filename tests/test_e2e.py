"""Real vLLM (CPU build, tests/images.py) across two emulated nodes, deployed by `vllm-compose up`
from generated stacks: the native backend serves the tiny model with tensor parallelism over both
nodes; the Ray backend forms the real Ray cluster and stops where vLLM's CPU platform does."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import clusters, images
from tests.clusters import cli
from tests.testbed import MODELS, Node, Testbed

pytestmark = pytest.mark.testbed

MODEL = f"{MODELS}/{images.MODEL}"
VLLM = "{port: 30000, max_model_len: 256, startup_timeout: 600, args: [--dtype, float32, --enforce-eager]}"


@pytest.fixture
def pair(vllm_testbed: Testbed, tmp_path: Path) -> Iterator[tuple[Testbed, Path]]:
    yield vllm_testbed, tmp_path
    clusters.clean(vllm_testbed, tmp_path)


def config(tmp: Path, bed: Testbed, name: str, backend: str) -> Path:
    nodes = bed.nodes[:2]
    return clusters.write_config(
        tmp / f"{name}.yaml", name, nodes, images.VLLM, backend=backend, model=MODEL, vllm=VLLM
    )


def test_native_tp2_over_two_nodes_answers_a_chat_completion_and_down_leaves_nothing(pair) -> None:
    bed, tmp = pair
    head, worker = bed.nodes[:2]
    path = config(tmp, bed, "native", "native")
    up = cli("up", path, cwd=tmp)
    assert up.returncode == 0, up.stderr
    assert "ready: http://192.168.200.12:30000/v1" in up.stdout

    key = clusters.api_key(path)
    assert (
        "api key: generated" in up.stderr
        and (tmp / "native.api-key").stat().st_mode & 0o777 == 0o600
    )
    request = {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}
    url = "http://192.168.200.12:30000/v1/chat/completions"
    chat = ["curl", "-s", "-m", "60", url, "-H", "Content-Type: application/json"]
    refused = worker.nsexec(
        *chat, "-o", "/dev/null", "-w", "%{http_code}", "-d", json.dumps(request)
    )
    assert refused.stdout == "401"  # the API key is required
    out = worker.nsexec(
        *chat, "-f", "-H", f"Authorization: Bearer {key}", "-d", json.dumps(request)
    )
    answer = json.loads(out.stdout)
    assert answer["object"] == "chat.completion"
    assert answer["usage"]["completion_tokens"] == 4
    assert answer["choices"][0]["message"]["content"]
    # Tensor parallelism really spans the nodes: the worker's container holds rank 1 of 2.
    worker_log = worker.docker.container.logs("native-serve-1")
    assert "world_size=2 rank=1" in worker_log
    assert "tcp://192.168.200.12:29501" in worker_log

    assert secret_seen_in(key, tmp, [head, worker], "native") == []

    down = cli("down", path, cwd=tmp)
    assert down.returncode == 0, down.stderr
    assert clusters.leftovers(head, "native") == [] and clusters.leftovers(worker, "native") == []


def test_watch_brings_tp2_back_after_the_worker_container_is_killed(pair) -> None:
    """The field failure: a dead worker leaves the head up and serving nothing. `up --watch`
    names it, recreates the whole group in order and serving comes back."""
    bed, tmp = pair
    head, worker = bed.nodes[:2]
    path = config(tmp, bed, "watched", "native")
    watcher = clusters.Background(
        "up", path, "--watch", "--interval", "5", "--backoff", "1", "--deadline", "30", cwd=tmp
    )
    try:
        watcher.wait_for("ready: http://192.168.200.12:30000/v1", 900)
        watcher.wait_for("watch: ok", 120)
        before = {n.name: clusters.containers(n, "watched")["serve"].id for n in (head, worker)}
        worker.docker.container.kill(before[worker.name])
        failed = watcher.wait_for("watch: check failed (1/2)", 60)
        assert "spark2: serve exited (exit 137)" in failed
        watcher.wait_for("recreating the whole group", 60)
        watcher.wait_for("watch: recovery 1 done: serving again", 900)
        watcher.wait_for("watch: ok", 120)
        after = {n.name: clusters.containers(n, "watched")["serve"].id for n in (head, worker)}
        assert set(after.values()).isdisjoint(before.values())  # the whole group, not one rank
        answer = chat(worker, clusters.api_key(path))
        assert answer["choices"][0]["message"]["content"]
    finally:
        stopped = watcher.interrupt()
    assert stopped == 130, watcher.output
    assert watcher.lines[-1].endswith("watch: stopped; the group is left as it is")
    assert clusters.containers(head, "watched")["serve"].state.running  # left as it is


def chat(node: Node, key: str) -> dict:
    request = {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}
    url = "http://192.168.200.12:30000/v1/chat/completions"
    auth = f"Authorization: Bearer {key}"
    out = node.nsexec("curl", "-sf", "-m", "60", url, "-H", auth, "-H",
                      "Content-Type: application/json", "-d", json.dumps(request))  # fmt: skip
    return json.loads(out.stdout)


def secret_seen_in(secret: str, folder: Path, nodes: list[Node], project: str) -> list[str]:
    """Every place the secret must never be, that holds it: the files written beside the config
    (but the key file itself), `docker inspect` and the logs of the project's containers, and the
    command lines of every process in them."""
    found = [
        str(p)
        for p in folder.rglob("*")
        if p.is_file() and p.name != f"{project}.api-key" and secret.encode() in p.read_bytes()
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


def test_ray_backend_forms_the_real_cluster_then_names_why_vllm_cpu_stops(pair) -> None:
    """vLLM's CPU platform refuses the Ray executor (a limit of the CPU build, not of the stack):
    everything up to `vllm serve` is real, and `up` names that cause instead of "exited (1)"."""
    bed, tmp = pair
    head = bed.nodes[0]
    path = config(tmp, bed, "viaray", "ray")
    up = cli("up", path, "--serve-timeout", "300", "--keep-on-failure", cwd=tmp)
    assert up.returncode == 1
    assert (
        "node 'spark1': phase 'serve' failed: serve stopped: "
        "ValueError: current platform cpu does not support ray."
    ) in up.stderr
    # The cluster-complete gate had passed: both nodes alive in Ray at their private IPs.
    status = json.loads(cli("status", path, "--json", cwd=tmp).stdout)
    assert [(row["node"], row["ray_alive_at_ip"]) for row in status] == [
        ("spark1", True),
        ("spark2", True),
    ]
    serve_log = head.docker.container.logs("viaray-serve-1")
    assert "Connected to Ray cluster." in serve_log
