"""The compile caches' volume with real vLLM compiling (torch.compile on, the compile-enabled test
image): it survives a recreate, whose start then compiles no kernel anew (Inductor finds every one
in the volume). That another image or model gets a volume of its own is the volume's name
(tests/test_render.py): starting a third vLLM to compile into a new, empty volume would test Docker.
vLLM 0.32's CPU build cannot load its own saved AOT function back, so the test image turns AOT off
(tests/support/images.py): on CPU the volume holds Inductor's graphs and kernels."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from python_on_whales import DockerClient

from tests.support import clusters, images
from tests.support.clusters import Pair, cli
from tests.support.testbed import MODELS, Node, Testbed

pytestmark = pytest.mark.testbed

COMPILING = "Warming up model for the compilation"  # vLLM's line as torch.compile starts
# Inductor's compiled graphs and kernels in the volume (in its two-letter folders).
KERNELS = "find /var/cache/vllm-compose/inductor -path '*/??/*' -type f | wc -l"
VLLM = "{port: 30000, max_model_len: 256, startup_timeout: 900, args: [--dtype, float32]}"


@pytest.fixture
def pair(vllm_testbed: Testbed, tmp_path: Path) -> Iterator[tuple[Testbed, Path]]:
    image = images.vllm_compile_base(DockerClient())
    vllm_testbed.load_image(image, nodes=vllm_testbed.nodes[:2])
    vllm_testbed.remove_containers()  # and volumes: no cache from before this test
    yield vllm_testbed, tmp_path
    clusters.clean(vllm_testbed, tmp_path)


def caches(node: Node) -> list[str]:
    found = node.docker.volume.list(filters=[("label", "com.docker.compose.project=warm")])
    return sorted(v.name for v in found if "_compile-cache-" in v.name)


def serve_log(node: Node) -> str:
    return str(node.docker.container.logs("warm-serve-1"))


def kernels(node: Node) -> int:
    return int(str(node.docker.container.execute("warm-serve-1", ["sh", "-c", KERNELS])))


def test_the_compile_cache_survives_a_recreate_and_its_start_compiles_nothing(pair: Pair) -> None:
    bed, tmp = pair
    head, worker = bed.nodes[:2]
    path = clusters.write_config(tmp / "warm.yaml", "warm", [head, worker], images.VLLM_COMPILE,
                                 backend="native", model=f"{MODELS}/{images.MODEL}", vllm=VLLM)  # fmt: skip
    assert cli("up", path, cwd=tmp, timeout=1200).returncode == 0
    assert COMPILING in serve_log(head), serve_log(head)[-3000:]
    first, compiled = caches(head), kernels(head)
    assert len(first) == 1 and caches(worker) == first and compiled > 0

    for node in (head, worker):  # a recreate: the containers go, the volumes stay
        node.docker.container.remove(list(clusters.containers(node, "warm").values()), force=True)
    assert cli("up", path, cwd=tmp, timeout=1200).returncode == 0
    assert caches(head) == first
    assert kernels(head) == compiled  # not one kernel compiled anew: all came from the volume
