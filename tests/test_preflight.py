"""Preflight's checks as pure functions of the config and the facts each node reported. Facts here
are written by hand (the shape `vllm-compose-health facts` prints); the testbed tests in
test_preflight_testbed.py produce them for real, from injected faults."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from generator import config
from generator.base.verdict import Check
from generator.operations import checks as checking
from tests.test_config import CASES

# Ray backend, spark-1 .12 head, spark-2 .13; the Spark profile asks for unlimited memlock.
SAMPLE = config.load(CASES / "sample.yaml").model_copy(update={"profile": "dgx-spark"})
MODEL = {"config.json": 700, "model-00001.safetensors": 5_000_000_000}
BASE = "sha256:" + "a" * 64


def facts(ip: str, peer: str, **changes: Any) -> dict[str, Any]:
    found: dict[str, Any] = {
        "interface": {"exists": True, "up": True, "addresses": [ip]},
        "reach": {"to": {peer: "ok"}, "heard_from": [peer]},
        "versions": {"python": "3.12.3", "vllm": "0.32.0", "ray": "2.58.0", "torch": "2.13.0"},
        "ray_on_path": True,
        "model": dict(MODEL),
        "shm_bytes": 60 << 30,
        "memlock": -1,
        "memory_monitor": "0",
        "api_port_free": True,
        "rdma": {"rocep1s0f1/1": "ACTIVE"},
        "gpus": 1,
    }
    found.update(copy.deepcopy(changes))
    return found


def healthy() -> dict[str, dict[str, Any]]:
    return {
        "spark-1": facts("192.168.200.12", "192.168.200.13"),
        "spark-2": facts("192.168.200.13", "192.168.200.12", api_port_free=None),
    }


def evaluate(
    cluster: config.Cluster,
    all_facts: dict[str, dict[str, Any]],
    bases: dict[str, str | None],
    running: checking.Running | None = None,
) -> list[Check]:
    """The checks, on facts as the nodes' containers print them (JSON)."""
    typed = {node: checking.Facts.model_validate(found) for node, found in all_facts.items()}
    return checking.evaluate(cluster, typed, bases, running or checking.Running())


def failures(all_facts: dict[str, Any], bases: dict[str, str | None] | None = None) -> list[str]:
    bases = bases or {"spark-1": BASE, "spark-2": BASE}
    return [
        f"{c.name} {c.node}: {c.cause}"
        for c in evaluate(SAMPLE, all_facts, bases)
        if c.status == "fail"
    ]


def test_a_healthy_pair_passes_every_check() -> None:
    checks = evaluate(SAMPLE, healthy(), {"spark-1": BASE, "spark-2": BASE})
    assert [c for c in checks if c.status != "pass"] == []
    assert {c.name for c in checks} == {
        "config", "image", "interface", "reach", "ray", "model", "shm", "memlock",
        "mem-monitor", "rdma", "gpus", "versions", "api-port", "clusters",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("node", "change", "expected"),
    [
        ("spark-2", {"interface": {"exists": False, "up": False, "addresses": []}},
         "interface spark-2: enp1s0f1np1 does not exist"),
        ("spark-2", {"interface": {"exists": True, "up": False, "addresses": []}},
         "interface spark-2: enp1s0f1np1 is down"),
        ("spark-1", {"interface": {"exists": True, "up": True, "addresses": ["10.1.1.1"]}},
         "interface spark-1: enp1s0f1np1 carries 10.1.1.1, not 192.168.200.12"),
        ("spark-2", {"reach": {"to": {"192.168.200.12": "timed out"}, "heard_from": []}},
         "reach spark-2: cannot reach spark-1 at 192.168.200.12 over TCP: timed out"),
        ("spark-2", {"ray_on_path": False},
         "ray spark-2: hellohal2064/vllm-qwen3.5-gb10:latest has no 'ray' on PATH"),
        ("spark-1", {"ray_client": False},
         "ray spark-1: hellohal2064/vllm-qwen3.5-gb10:latest has the minimal Ray: the head's"
         " `ray start` needs Ray's client extra"),
        ("spark-2", {"model": None}, "model spark-2: /models/Qwen3.5-122B-A10B-FP8 is missing"),
        ("spark-2", {"model": {"config.json": 700}},
         "model spark-2: /models/Qwen3.5-122B-A10B-FP8 differs from spark-1's: "
         "missing: model-00001.safetensors"),
        ("spark-2", {"model": {"config.json": 700, "model-00001.safetensors": 4096}},
         "model spark-2: /models/Qwen3.5-122B-A10B-FP8 differs from spark-1's: "
         "size differs: model-00001.safetensors"),
        ("spark-2", {"model": {"config.json": 700, "model-00001.safetensors": -1}},
         "model spark-2: /models/Qwen3.5-122B-A10B-FP8: dangling symlinks: model-00001.safetensors"),
        ("spark-2", {"model": {"config.json": 700, "model-00001.safetensors": -1},
                     "unreachable_links": {"model-00001.safetensors": "/hf/blobs/ab12"}},
         "model spark-2: /models/Qwen3.5-122B-A10B-FP8: model-00001.safetensors links to"
         " /hf/blobs/ab12, which the containers cannot see"),
        ("spark-1", {"shm_bytes": 64 << 20},
         "shm spark-1: /dev/shm is 64 MiB in the container, at least 1024 MiB needed"),
        ("spark-2", {"memory_monitor": None},
         "mem-monitor spark-2: RAY_memory_monitor_refresh_ms=None: Ray may kill workers during "
         "the load"),
        ("spark-1", {"api_port_free": False},
         "api-port spark-1: port 30000 on 192.168.200.12 is already in use"),
        ("spark-2", {"versions": {"python": "3.12.3", "vllm": "0.31.0", "ray": "2.58.0",
                                  "torch": "2.13.0"}},
         "versions all: vllm differs: spark-1 0.32.0, spark-2 0.31.0"),
        ("spark-2", {"gpus": 0}, "gpus spark-2: 0 GPUs visible, 1 configured"),
        ("spark-2", {"memlock": 65536},
         "memlock spark-2: locked memory is limited to 64 KiB in the container: RDMA registration "
         "fails"),
        ("spark-2", {"rdma": {"rocep1s0f1/1": "DOWN"}},
         "rdma spark-2: RDMA ports not active: rocep1s0f1/1"),
        ("spark-2", {"rdma": {}},
         "rdma spark-2: profile dgx-spark needs RDMA and the node has no RDMA device"),
    ],
)  # fmt: skip
def test_each_fault_is_named_alone(node: str, change: dict[str, Any], expected: str) -> None:
    found = healthy()
    found[node].update(change)
    assert failures(found) == [expected]


def test_different_base_images_are_named() -> None:
    other = "sha256:" + "b" * 64
    assert failures(healthy(), {"spark-1": BASE, "spark-2": other}) == [
        "image all: hellohal2064/vllm-qwen3.5-gb10:latest is a different image on spark-2 than on "
        "spark-1: spark-1 aaaaaaaaaaaa, spark-2 bbbbbbbbbbbb"
    ]


def test_a_node_holding_only_the_streamed_wrapper_is_not_compared() -> None:
    assert failures(healthy(), {"spark-1": BASE, "spark-2": None}) == []


def test_the_api_port_taken_by_this_stacks_own_serve_or_front_door_passes() -> None:
    found = healthy()
    found["spark-1"]["api_port_free"] = False
    bases: dict[str, str | None] = {"spark-1": BASE, "spark-2": BASE}
    for running, holder in [
        (checking.Running(serve=True), "serve"),
        (checking.Running(door=True), "front door"),
    ]:
        checks = evaluate(SAMPLE, found, bases, running)
        said = [c.cause for c in checks if c.name == "api-port"]
        assert said == [f"port 30000 is this stack's {holder}"]
    checks = evaluate(SAMPLE, found, bases)
    assert [c.status for c in checks if c.name == "api-port"] == ["fail"]


def test_no_rdma_is_only_a_skip_where_the_profile_needs_none() -> None:
    generic = SAMPLE.model_copy(update={"profile": "generic"})
    found = healthy()
    found["spark-2"]["rdma"] = {}
    checks = evaluate(generic, found, {"spark-1": BASE, "spark-2": BASE})
    assert [(c.status, c.cause) for c in checks if c.name == "rdma" and c.node == "spark-2"] == [
        ("skip", "no RDMA devices: NCCL uses TCP sockets")
    ]


def test_native_backend_and_no_accelerator_skip_what_does_not_apply() -> None:
    native = SAMPLE.model_copy(update={"backend": "native", "accelerator": "none"})
    checks = evaluate(native, healthy(), {"spark-1": BASE, "spark-2": BASE})
    skipped = sorted({c.name for c in checks if c.status == "skip"})
    assert skipped == ["gpus", "mem-monitor", "ray", "rdma"]


def test_a_node_without_facts_is_left_out_not_failed() -> None:
    found = healthy()
    del found["spark-2"]
    assert failures(found) == []


def test_a_ray_without_token_authentication_fails_unless_it_is_turned_off() -> None:
    found = healthy()
    for facts in found.values():
        facts["versions"] = facts["versions"] | {"ray": "2.49.1"}
    assert failures(found) == [
        f"ray {node}: ray 2.49.1 has no token authentication (2.52+): its ports would be open"
        for node in ("spark-1", "spark-2")
    ]
    off = SAMPLE.model_copy(update={"ray": SAMPLE.ray.model_copy(update={"token_auth": False})})
    checks = evaluate(off, found, {"spark-1": BASE, "spark-2": BASE})
    assert [c for c in checks if c.status == "fail"] == []
