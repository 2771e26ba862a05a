"""By hand, per node, with nothing but the rendered folder: `vllm-compose render` once, then plain
`docker compose up -d` in each node's folder against that node's engine, with real vLLM. No
vllm-compose command runs after render; the API key comes from the folder."""

from __future__ import annotations

import collections
import json
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import clusters, images
from tests.support.clusters import Pair, cli
from tests.support.testbed import Node, Testbed
from tests.test_e2e import MODEL, VLLM, VLLM_RAY
from tests.test_replicas import REPLICAS

pytestmark = pytest.mark.testbed

URL = "http://192.168.200.12:30000/v1/chat/completions"
SERVERS = {"replica-1", "replica-2"}  # the door's names of the two replicas


@pytest.fixture
def pair(vllm_testbed: Testbed, tmp_path: Path) -> Iterator[tuple[Testbed, Path]]:
    yield vllm_testbed, tmp_path
    vllm_testbed.remove_containers()


def compose(node: Node, folder: Path, *args: str) -> subprocess.Popen[str]:
    """Plain `docker compose ARGS` in the node's folder, against the node's engine."""
    return subprocess.Popen(
        ["docker", "--context", node.context, "compose", *args],
        cwd=folder,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def done(proc: subprocess.Popen[str], seconds: float = 900) -> str:
    out, _ = proc.communicate(timeout=seconds)
    assert proc.returncode == 0, out
    return out


def answered(node: Node, folder: Path, seconds: float = 600, prompt: str = "Hello") -> (
        dict[str, Any]):  # fmt: skip
    """A chat completion from `node`, with the key the head's folder holds; retried (every 3 s,
    at most `seconds`) while the model loads."""
    key = (folder / "secrets" / "api-key").read_text().strip()
    body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": 4}
    request = ["curl", "-sf", "-m", "30", URL, "-H", f"Authorization: Bearer {key}"]
    request += ["-H", "Content-Type: application/json", "-d", json.dumps(body)]
    deadline = time.monotonic() + seconds
    while True:
        out = node.nsexec(*request, check=False)
        if out.returncode == 0:
            return dict(json.loads(out.stdout))
        assert time.monotonic() < deadline, f"no answer in {seconds:g} s: {out.stderr}"
        time.sleep(3)


def listed_healthy(node: Node, folder: Path, seconds: float = 60) -> str:
    """`docker compose ps` once it shows serve healthy (its check runs every 15 s): polled every
    3 s, at most `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        listed = done(compose(node, folder, "ps"))
        serve = [line for line in listed.splitlines() if "-serve-" in line]
        if serve and "(healthy)" in serve[0]:
            return serve[0]
        assert time.monotonic() < deadline, listed
        time.sleep(3)


def down(head: Node, worker: Node, folders: Path, backend: str) -> None:
    """`docker compose down` in each folder removes that node's containers; like every named
    volume, the Ray head's shared temp folder and each node's compile caches stay until
    `down -v`."""
    for node in (head, worker):
        done(compose(node, folders / node.name, "down"))
    kept = ["volume byhand_shared-tmp"] if backend == "ray" else []
    assert clusters.uncached(clusters.leftovers(head, "byhand")) == kept
    assert clusters.uncached(clusters.leftovers(worker, "byhand")) == []
    for node in (head, worker):
        done(compose(node, folders / node.name, "down", "-v"))
        assert clusters.leftovers(node, "byhand") == []


# "replicas": two native groups of one node each behind the first's door, prefix affinity on
# (tests/test_replicas.py starts them with `up`, least connections); by hand, each node's folder
# starts its replica and the door finds the other. "ray": one group over both nodes.
@pytest.mark.parametrize("backend", ["replicas", "ray"])
def test_rendered_folders_start_with_plain_compose_in_either_order_from_anywhere(
    pair: Pair, backend: str
) -> None:
    bed, tmp = pair
    head, worker = bed.nodes[:2]
    path = clusters.write_config(
        tmp / "byhand.yaml",
        "byhand",
        [head, worker],
        images.VLLM,
        backend="ray" if backend == "ray" else "native",
        model=MODEL,
        vllm=VLLM_RAY if backend == "ray" else VLLM,
        extra="" if backend == "ray" else REPLICAS,
        door="" if backend == "ray" else "balance: prefix",
    )
    rendered = cli("render", path, cwd=tmp)
    assert rendered.returncode == 0, rendered.stderr
    assert "(secret: mode 0600, contents never shown)" in rendered.stdout
    folders = tmp / "compose" / "byhand"

    # Worker first, then the head (serve starts with its Ray; vLLM waits for the worker's slot).
    done(compose(worker, folders / "spark2", "up", "-d"))
    done(compose(head, folders / "spark1", "up", "-d"))
    assert answered(worker, folders / "spark1")["usage"]["completion_tokens"] == 4
    assert "(healthy)" in listed_healthy(head, folders / "spark1")
    # That answer came through the front door, which the folder starts too: vLLM itself listens
    # on the head's loopback only.
    assert "byhand-front-door-1" in done(compose(head, folders / "spark1", "ps"))
    behind = worker.nsexec("curl", "-s", "-m", "5", "http://192.168.200.12:8400/v1/models",
                           check=False)  # fmt: skip
    assert behind.returncode == 7, behind  # curl: could not connect
    if backend == "replicas":
        affine(worker, folders / "spark1", head)
    down(head, worker, folders, backend)

    if backend == "replicas":  # the other order, from elsewhere, is the one group's below
        return
    # The folders copied elsewhere, the originals and the config's files gone: nothing in them
    # points back. Head first this time: vLLM waits in its placement group for the worker.
    elsewhere = tmp / "elsewhere"
    shutil.copytree(folders, elsewhere)
    shutil.rmtree(tmp / "compose")
    shutil.rmtree(tmp / "byhand.state")  # the config's state folder: its secrets too
    for leftover in tmp.glob("byhand.*"):
        leftover.unlink()
    starting = compose(head, elsewhere / "spark1", "up", "-d")
    done(compose(worker, elsewhere / "spark2", "up", "-d"))
    done(starting)
    assert answered(worker, elsewhere / "spark1")["usage"]["completion_tokens"] == 4
    down(head, worker, elsewhere, backend)


def affine(client: Node, folder: Path, head: Node) -> None:
    """Both replicas up at the door (its checks), then with `balance: prefix` each prompt lands
    on one replica every time, and the prompts on both (the door's log names each request's)."""
    door = "byhand-front-door-1"
    deadline = time.monotonic() + 120
    # Each replica's last state the door logged (they start down: their vLLMs still load).
    up = {r: "UP" for r in SERVERS}
    while dict(re.findall(r"Server replicas/(replica-\d) is (UP|DOWN)", logs(head, door))) != up:
        assert time.monotonic() < deadline, logs(head, door)[-3000:]
        time.sleep(1)
    topics = [topic for topic in ("ships", "bees", "salt", "rain", "iron", "moss") for _ in "abc"]
    before = len(served(head, door))
    for topic in topics:
        answered(client, folder, prompt=f"Tell me about {topic}.")
    while len(served(head, door)) < before + len(topics):  # each logged as its answer ends
        assert time.monotonic() < deadline, served(head, door)[before:]
        time.sleep(0.2)
    seen = collections.defaultdict(set)
    for topic, replica in zip(topics, served(head, door)[before:], strict=True):
        seen[topic].add(replica)
    assert all(len(replicas) == 1 for replicas in seen.values()), seen
    assert set().union(*seen.values()) == SERVERS, seen


def served(head: Node, door: str) -> list[str]:
    """The replica of each request the door logged, in order."""
    return re.findall(r" replicas/(replica-\d) \S+ \d+ ", logs(head, door))


def logs(node: Node, container: str) -> str:
    return str(node.docker.container.logs(container))
