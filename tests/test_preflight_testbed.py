"""Preflight on the testbed: one injected fault per check, each named with its node by
`vllm-compose preflight` (or by `up`, which runs it first). The time to each named error is the
benchmark's to measure (benchmarks/time_to_named_error.py); here a generous bound only tells a
named error from a hang."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from generator.operations import preflight as preflight_module
from generator.operations import workflow
from tests.support import clusters, images
from tests.support.clusters import cli
from tests.support.testbed import Node, Testbed, sh

pytestmark = pytest.mark.testbed
NOT_A_HANG = 90  # seconds


@pytest.fixture
def bed(testbed: Testbed, tmp_path: Path) -> Iterator[Testbed]:
    yield testbed
    clusters.clean(testbed, tmp_path)


def preflight(config: Path) -> tuple[int, list[dict[str, str]], float]:
    start = time.monotonic()
    result = cli("preflight", config, "--json", cwd=config.parent)
    took = time.monotonic() - start
    assert result.stdout, result.stderr
    return result.returncode, json.loads(result.stdout), took


def failures(checks: list[dict[str, str]]) -> list[str]:
    return [f"{c['name']} {c['node']}: {c['cause']}" for c in checks if c["status"] == "fail"]


def write(tmp: Path, bed: Testbed, nodes: list[Node] | None = None, **kw) -> Path:  # type: ignore[no-untyped-def]
    return clusters.write_config(
        tmp / "c.yaml", "pre", nodes or bed.nodes[:2], kw.pop("image", images.STANDIN), **kw
    )


def test_a_healthy_three_node_cluster_passes(bed: Testbed, tmp_path: Path) -> None:
    code, checks, took = preflight(write(tmp_path, bed, bed.nodes[:3]))
    assert failures(checks) == [] and code == 0
    reach = [c["cause"] for c in checks if c["name"] == "reach"]
    assert len(reach) == 6  # every ordered pair
    assert "reaches spark2 at 192.168.200.13 over TCP" in reach
    skipped = {c["name"] for c in checks if c["status"] == "skip"}
    assert skipped == {"memlock", "rdma", "gpus"}  # no RDMA or GPUs on the testbed
    assert took < NOT_A_HANG


def test_the_page_cache_is_dropped_only_when_asked_and_each_node_says_what_it_freed(
    bed: Testbed, tmp_path: Path
) -> None:
    # The emulated nodes share this machine's kernel: each drop is the machine's, harmless.
    config = write(tmp_path, bed)
    _, checks, _ = preflight(config)
    assert "drop-caches" not in {c["name"] for c in checks}
    result = cli("preflight", config, "--json", "--drop-caches", cwd=config.parent)
    dropped = [c for c in json.loads(result.stdout) if c["name"] == "drop-caches"]
    assert [(c["node"], c["status"]) for c in dropped] == [
        ("spark1", "pass"),
        ("spark2", "pass"),
    ], dropped
    assert all("GiB freed" in c["cause"] for c in dropped), dropped
    assert result.returncode == 0, result.stderr


def test_a_context_that_does_not_answer(bed: Testbed, tmp_path: Path) -> None:
    sh("docker", "context", "create", "pre-dead", "--docker", "host=unix:///run/pre-dead.sock")
    try:
        config = write(tmp_path, bed, contexts=[bed.nodes[0].context, "pre-dead"])
        code, checks, took = preflight(config)
    finally:
        sh("docker", "context", "rm", "-f", "pre-dead")
    assert code == 1
    found = failures(checks)
    assert found[0].startswith("context spark2: context 'pre-dead' does not answer: ")
    assert took < NOT_A_HANG


def test_an_interface_that_is_down(bed: Testbed, tmp_path: Path) -> None:
    worker = bed.nodes[1]
    bed.link_down(worker)
    try:
        _code, checks, _ = preflight(write(tmp_path, bed))
    finally:
        bed.link_up(worker)
    assert "interface spark2: enp1s0f1np1 is down" in failures(checks)


def test_an_interface_without_the_configured_ip(bed: Testbed, tmp_path: Path) -> None:
    config = write(tmp_path, bed)
    # spark2's context, but the IP of spark3 (which exists, so nothing leaves the testbed).
    config.write_text(config.read_text().replace("ip: 192.168.200.13", "ip: 192.168.200.14"))
    _code, checks, _ = preflight(config)
    found = failures(checks)
    assert "interface spark2: enp1s0f1np1 carries 192.168.200.13, not 192.168.200.14" in found
    # spark2 told spark1 so, rather than spark1 taking spark3's refusals for a late listener.
    told = "reach spark1: cannot reach spark2 at 192.168.200.14 over TCP: its node does not carry"
    assert any(line.startswith(told) for line in found), found


def test_a_missing_interface(bed: Testbed, tmp_path: Path) -> None:
    config = write(tmp_path, bed)
    config.write_text(
        config.read_text().replace("ip: 192.168.200.13,", "ip: 192.168.200.13, interface: eth7,")
    )
    assert "interface spark2: eth7 does not exist" in failures(preflight(config)[1])


def test_peers_that_cannot_reach_each_other(bed: Testbed, tmp_path: Path) -> None:
    head, worker = bed.nodes[:2]
    bed.drop(head, worker.ip)
    try:
        _code, checks, took = preflight(write(tmp_path, bed))
    finally:
        bed.undrop(head, worker.ip)
    found = failures(checks)
    assert any(
        f.startswith("reach spark2: cannot reach spark1 at 192.168.200.12 over TCP") for f in found
    )
    assert any(
        f.startswith("reach spark1: cannot reach spark2 at 192.168.200.13 over TCP") for f in found
    )
    assert took < NOT_A_HANG


def test_up_stops_at_preflight_and_starts_nothing(bed: Testbed, tmp_path: Path) -> None:
    head, worker = bed.nodes[:2]
    bed.drop(head, worker.ip)
    try:
        result = cli("up", write(tmp_path, bed), cwd=tmp_path)
    finally:
        bed.undrop(head, worker.ip)
    assert result.returncode == 1
    assert "preflight: 2 checks failed in " in result.stderr
    assert "hint: fix these, or skip them with --skip-preflight" in result.stderr
    assert clusters.containers(head, "pre") == {} and clusters.containers(worker, "pre") == {}


def _tag_on(node: Node, source: str, tag: str) -> None:
    sh("docker", "--context", node.context, "tag", source, tag)


@contextlib.contextmanager
def built_on(node: Node, tag: str, dockerfile: str) -> Iterator[None]:
    subprocess.run(
        ["docker", "--context", node.context, "build", "-q", "-t", tag, "-"],
        input=dockerfile,
        text=True,
        check=True,
        capture_output=True,
    )
    try:
        yield
    finally:
        sh("docker", "--context", node.context, "rmi", "-f", tag, check=False)


def test_a_different_image_and_versions_on_one_node(bed: Testbed, tmp_path: Path) -> None:
    """The same tag, another image on spark2: one whose Ray reports another version."""
    head, worker = bed.nodes[:2]
    tag = "pre-drift:1"
    fake_ray = (
        f"FROM {images.STANDIN}\n"
        "RUN mkdir -p /opt/fake/ray-2.57.0.dist-info && printf 'Metadata-Version: 2.1\\n"
        "Name: ray\\nVersion: 2.57.0\\n' > /opt/fake/ray-2.57.0.dist-info/METADATA\n"
        "ENV PYTHONPATH=/opt/fake:/opt/site\n"
    )
    _tag_on(head, images.STANDIN, tag)
    try:
        with built_on(worker, tag, fake_ray):
            _code, checks, _ = preflight(write(tmp_path, bed, image=tag))
    finally:
        sh("docker", "--context", head.context, "rmi", tag, check=False)
    found = failures(checks)
    assert any(
        f.startswith(f"image all: {tag} is a different image on spark2 than on spark1")
        for f in found
    )
    assert "versions all: ray differs: spark1 2.58.0, spark2 2.57.0" in found


def test_an_image_without_ray_for_the_ray_backend(bed: Testbed, tmp_path: Path) -> None:
    nodes = bed.nodes[:2]
    bed.load_image(images.DEBIAN, nodes=nodes)
    _code, checks, _ = preflight(write(tmp_path, bed, image=images.DEBIAN))
    found = failures(checks)
    assert f"ray spark1: {images.DEBIAN} has no 'ray' on PATH" in found
    assert f"ray spark2: {images.DEBIAN} has no 'ray' on PATH" in found


def test_a_model_file_missing_on_a_worker(bed: Testbed, tmp_path: Path) -> None:
    worker = bed.nodes[1]
    bed.remove_path(worker, "standin-model/config.json")
    try:
        found = failures(preflight(write(tmp_path, bed))[1])
    finally:
        clusters.place_standin_model(bed)
    assert found == [
        f"model spark2: {clusters.STANDIN_MODEL} differs from spark1's: missing: config.json"
    ]


def test_a_model_folder_missing_on_a_worker(bed: Testbed, tmp_path: Path) -> None:
    worker = bed.nodes[1]
    config = write(tmp_path, bed, model=f"{clusters.STANDIN_MODEL}-only-on-spark1")
    only = Path(bed.nodes[0].models) / "standin-model-only-on-spark1"
    only.mkdir(exist_ok=True)
    (only / "weights.bin").write_bytes(b"\0" * 1000)
    try:
        found = failures(preflight(config)[1])
    finally:
        bed.remove_path(bed.nodes[0], "standin-model-only-on-spark1")
    assert found == [
        f"model spark2: {clusters.STANDIN_MODEL}-only-on-spark1 is missing (the node's other "
        "checks need it to run)"
    ]
    # The stack's mount does not create it: no empty folder left behind on the node.
    assert not (Path(worker.models) / "standin-model-only-on-spark1").exists()


def test_a_small_dev_shm(bed: Testbed, tmp_path: Path) -> None:
    head = bed.nodes[0]
    bed.shm_size(head, "64m")
    try:
        found = failures(preflight(write(tmp_path, bed))[1])
    finally:
        bed.shm_size(head, "4g")
    assert found == ["shm spark1: /dev/shm is 64 MiB in the container, at least 1024 MiB needed"]


def test_the_memory_monitor_turned_back_on(bed: Testbed, tmp_path: Path) -> None:
    config = write(tmp_path, bed, extra="env: {RAY_memory_monitor_refresh_ms: '250'}")
    found = failures(preflight(config)[1])
    assert found == [
        "mem-monitor spark1: RAY_memory_monitor_refresh_ms=250: Ray may kill workers during the load",
        "mem-monitor spark2: RAY_memory_monitor_refresh_ms=250: Ray may kill workers during the load",
    ]


def test_the_api_port_taken_on_the_head(bed: Testbed, tmp_path: Path) -> None:
    with bed.listening(bed.nodes[0], 30000, images.STANDIN):
        found = failures(preflight(write(tmp_path, bed))[1])
    assert found == ["api-port spark1: port 30000 on 192.168.200.12 is already in use"]


def test_a_reach_port_in_use_is_tried_again_on_another(
    bed: Testbed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Anything on a node may hold the random reach port (a serving group's outgoing
    connection did, once): preflight takes another rather than failing the check."""
    monkeypatch.setattr(preflight_module, "REACH_PORTS", (20000, 20002))
    monkeypatch.setattr(preflight_module, "random", types.SimpleNamespace(choice=min))
    said: list[str] = []
    config = write(tmp_path, bed)
    with (
        bed.listening(bed.nodes[0], 20000, images.STANDIN),
        workflow.opened(config, tmp_path / "compose", said.append, with_secrets=True) as opened,
    ):
        found, _ = preflight_module.run(opened.fleet)
    assert [c.line() for c in found if c.status == "fail"] == []
    assert "preflight: port 20000 is in use on spark1; trying another" in said
    assert any(c.name == "reach" and "reaches spark2" in c.cause for c in found)
