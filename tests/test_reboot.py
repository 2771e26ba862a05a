"""Power cuts on the emulated nodes (each node's engine and every process of its containers
killed at once, then the engine started again), with real vLLM on both backends: the group serves again with no command run, a
node that restarts alone makes the whole group start again together, and `down` stays final."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from python_on_whales import DockerClient

from tests.support import clusters, images
from tests.support.clusters import Pair, cli
from tests.support.testbed import Node, Testbed
from tests.test_e2e import MODEL, VLLM, VLLM_RAY, config

pytestmark = pytest.mark.testbed


@pytest.fixture
def pair(vllm_testbed: Testbed, tmp_path: Path) -> Iterator[tuple[Testbed, Path]]:
    yield vllm_testbed, tmp_path
    clusters.clean(vllm_testbed, tmp_path)


BACK_WITHIN = 420  # seconds a group may take to serve again after a power cut (bounded wait)


def answers(node: Node, key: str) -> bool:
    """One chat completion, sent from `node`, comes back (at most 20 s)."""
    request = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    found = node.nsexec(
        "curl", "-sf", "-m", "20", "http://192.168.200.12:30000/v1/chat/completions",
        "-H", f"Authorization: Bearer {key}", "-H", "Content-Type: application/json",
        "-d", json.dumps(request), check=False,
    )  # fmt: skip
    return found.returncode == 0 and '"chat.completion"' in found.stdout


def serving_again(node: Node, key: str) -> float:
    """Seconds until a completion comes back; fails after BACK_WITHIN."""
    start = time.monotonic()
    while time.monotonic() - start < BACK_WITHIN:
        if answers(node, key):
            return time.monotonic() - start
        time.sleep(2)
    raise AssertionError(f"not serving {BACK_WITHIN} s after the power came back")


def power_cut(bed: Testbed, nodes: list[Node]) -> None:
    """Power lost (engines and containers killed at once), then back."""
    bed.power_cut(nodes)
    for node in nodes:
        bed.start_engine(node)


@pytest.mark.parametrize("backend", ["native", "ray"])
def test_power_cuts_of_both_nodes_then_each_alone_and_the_group_serves_again_by_itself(
    pair: Pair, backend: str
) -> None:
    """Both nodes, then the worker alone, then the head alone: after each, the same containers
    serve again with no command run. After the worker's cut the head's side of the group says
    it broke and started again with it: no rank keeps serving a group that lost a member."""
    bed, tmp = pair
    head, worker = bed.nodes[:2]
    path = config(tmp, bed, backend, backend, VLLM if backend == "native" else VLLM_RAY)
    assert cli("up", path, cwd=tmp).returncode == 0
    key, before = clusters.api_key(path), clusters.ids([head, worker], backend)
    for cut in ([head, worker], [worker], [head]):
        starts = serve_starts(head, backend)
        power_cut(bed, cut)
        took = serving_again(worker, key)
        print(f"{backend}: power cut of {', '.join(n.name for n in cut)}: serving in {took:.0f} s")
        assert clusters.ids([head, worker], backend) == before  # restarted, never recreated
        # The head's serve never outlives a cut: after the worker's alone it started again too
        # (it saw the group break, or vLLM exited when its peer's connection closed).
        assert serve_starts(head, backend) > starts


def serve_starts(head: Node, project: str) -> int:
    """How often the supervisor in the head's serve has started vLLM so far."""
    log = str(head.docker.container.logs(f"{project}-serve-1"))
    return log.count("vllm-compose: starting vllm (start ")


def test_down_then_a_power_cut_brings_nothing_back(pair: Pair) -> None:
    """What a restart policy could bring back is Docker's and the stack's, not vLLM's: the Ray
    stand-in's stack (tests/support/images.py) serves here."""
    bed, tmp = pair
    head, worker = bed.nodes[:2]
    path = clusters.write_config(
        tmp / "gone.yaml", "gone", [head, worker], images.standin_base(DockerClient())
    )
    assert cli("up", path, cwd=tmp).returncode == 0
    assert cli("down", path, cwd=tmp).returncode == 0
    power_cut(bed, [head, worker])
    time.sleep(5)  # what a restart policy would start, the engine starts as it comes up
    assert clusters.leftovers(head, "gone") == [] and clusters.leftovers(worker, "gone") == []
    assert not head.docker.container.list() and not worker.docker.container.list()
