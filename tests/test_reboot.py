"""A stack taken down stays down through a power cut (each node's engine and every process of
its containers killed at once, then the engine started again). That a serving group comes back by
itself from power cuts is proved on groups other tests have serving (faults.survives_power_cuts):
real vLLM, both nodes at once natively in tests/test_upgrade.py, each node alone over Ray in
tests/test_e2e.py."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from python_on_whales import DockerClient

from tests.support import clusters, images
from tests.support.clusters import Pair, cli
from tests.support.faults import power_cut
from tests.support.testbed import Testbed

pytestmark = pytest.mark.testbed


@pytest.fixture
def pair(vllm_testbed: Testbed, tmp_path: Path) -> Iterator[tuple[Testbed, Path]]:
    yield vllm_testbed, tmp_path
    clusters.clean(vllm_testbed, tmp_path)


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
