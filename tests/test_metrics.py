"""The `metrics` section as rendered: Prometheus on the head, exporters on every node, each on its
node's private IP, and what Prometheus scrapes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from generator import config
from generator.base.errors import ConfigError
from generator.config import rules
from generator.stack import NodeStack, doorcounts, frontdoor, monitoring, render

CASES = Path(__file__).parent / "cases"

NATIVE_CPU = """\
name: m
image: vllm/vllm-openai:v0.32.0
backend: native
accelerator: none
interface: eth0
nodes:
  - {name: a, ip: 10.0.0.1}
  - {name: b, ip: 10.0.0.2}
model: {path: /models/m}
"""


def stacks(text: str) -> dict[str, dict[str, Any]]:
    files = render.render(config.parse(text), "m.yaml")
    return {
        rel.split("/")[0]: yaml.safe_load(f.text)
        for rel, f in files.items()
        if rel.endswith("compose.yaml")
    }


def four_nodes() -> dict[str, dict[str, Any]]:
    return stacks((CASES / "four-node-pp.yaml").read_text())


def test_every_node_runs_its_exporters_on_its_private_ip_and_the_head_runs_prometheus() -> None:
    cluster = config.load(CASES / "four-node-pp.yaml")
    found = four_nodes()
    for node in cluster.nodes:
        services = found[node.name]["services"]
        want = {"ray", "node-exporter", "dcgm-exporter"} | (
            {"serve", "prometheus", "front-door", "front-door-counts"}
            if node == cluster.head
            else set()
        )
        assert set(services) == want, node.name
        exporter = services["node-exporter"]
        assert exporter["command"][0] == f"--web.listen-address={node.ip}:9100"
        assert exporter["pid"] == "host" and "volumes" not in exporter
        dcgm = services["dcgm-exporter"]
        assert dcgm["command"] == ["-a", f"{node.ip}:9400", "-f", monitoring.DCGM_COUNTERS_FILE]
        # Its fields are its own default file's names, with the heat and power throttle counters.
        assert [c["target"] for c in dcgm["configs"]] == [monitoring.DCGM_COUNTERS_FILE]
        fields = monitoring.dcgm_counters().splitlines()
        assert "DCGM_FI_DEV_THERMAL_VIOLATION, counter" in "\n".join(fields)
        assert all(line.count(",") == 2 for line in fields)
        assert services["dcgm-exporter"]["deploy"]["resources"]["reservations"]["devices"]
        ray = services["ray"]["command"]
        assert ray[ray.index("--metrics-export-port") + 1] == "8090"
    head = found[cluster.head.name]
    prometheus = head["services"]["prometheus"]
    assert f"--web.listen-address={cluster.head.ip}:9090" in prometheus["command"]
    assert "secrets" not in prometheus  # vLLM behind the front door takes no key
    assert "prometheus-data" in head["volumes"]


def test_prometheus_scrapes_vllm_behind_the_door_and_every_exporter_by_node() -> None:
    cluster = config.load(CASES / "four-node-pp.yaml")
    head = four_nodes()[cluster.head.name]
    scraped = yaml.safe_load(head["configs"]["prometheus-config"]["content"])
    assert scraped["global"] == {"scrape_interval": "5s", "scrape_timeout": "5s"}
    jobs = {job["job_name"]: job for job in scraped["scrape_configs"]}
    assert list(jobs) == ["vllm", "front_door", "node", "ray", "dcgm"]
    assert "authorization" not in jobs["vllm"]
    assert jobs["vllm"]["static_configs"] == [
        {"targets": ["127.0.0.1:8400"], "labels": {"node": cluster.head.name}}
    ]
    # The door's counts per key: mtail on the head's loopback, beside Prometheus.
    assert jobs["front_door"]["static_configs"] == [
        {"targets": ["127.0.0.1:3910"], "labels": {"node": cluster.head.name}}
    ]
    for job, port in (("node", 9100), ("ray", 8090), ("dcgm", 9400)):
        assert jobs[job]["static_configs"] == [
            {"targets": [f"{n.ip}:{port}"], "labels": {"node": n.name}} for n in cluster.nodes
        ]


def test_without_a_gpu_or_ray_there_is_no_dcgm_or_ray_target_and_off_means_nothing() -> None:
    found = stacks(NATIVE_CPU + "metrics: {}\n")
    head = {"serve", "node-exporter", "prometheus", "front-door", "front-door-counts"}
    assert set(found["a"]["services"]) == head
    assert set(found["b"]["services"]) == {"serve", "node-exporter"}
    scraped = yaml.safe_load(found["a"]["configs"]["prometheus-config"]["content"])
    assert [job["job_name"] for job in scraped["scrape_configs"]] == ["vllm", "front_door", "node"]
    off = stacks(NATIVE_CPU)
    assert set(off["a"]["services"]) == {"serve", "front-door"}
    assert "prometheus-config" not in off["a"]["configs"]


def test_a_metrics_port_taken_by_another_setting_is_refused_naming_both() -> None:
    with pytest.raises(ConfigError) as caught:
        config.parse(NATIVE_CPU + "metrics: {node_exporter_port: 8000}\n")
    assert caught.value.problems == [
        "vllm.port: 8000 is taken by metrics.node_exporter_port; choose another"
    ]


def test_prometheus_on_every_address_is_allowed_with_a_warning() -> None:
    cluster = config.parse(NATIVE_CPU + "metrics: {listen: 0.0.0.0}\n")
    assert rules.warnings(cluster) == [
        "metrics.listen: 0.0.0.0; Prometheus answers on every address of the head, unauthenticated"
    ]
    prometheus = stacks(NATIVE_CPU + "metrics: {listen: 0.0.0.0}\n")["a"]["services"]["prometheus"]
    assert "--web.listen-address=0.0.0.0:9090" in prometheus["command"]
    assert rules.warnings(config.parse(NATIVE_CPU + "metrics: {}\n")) == []


def fingerprints(text: str, wrapper: str = "wrapper:1") -> dict[str, str]:
    cluster = config.parse(text)
    stack = NodeStack(cluster, cluster.head, "m.yaml", wrapper)
    found = {s.name: s.fingerprint for s in stack.services}
    return found | {s.name: s.fingerprint for s in stack.sidecars}


def test_a_changed_scrape_interval_recreates_prometheus_alone() -> None:
    before = fingerprints(NATIVE_CPU + "metrics: {}\n")
    after = fingerprints(NATIVE_CPU + "metrics: {scrape_interval: 5}\n")
    assert [name for name in before if before[name] != after[name]] == ["prometheus"]


def test_a_new_vllm_image_recreates_the_group_and_leaves_the_door_and_exporters_running() -> None:
    """`upgrade` pins the image to its ID: the group changes, and the front door, which holds
    the clients' requests through the switch, must not."""
    before = fingerprints(NATIVE_CPU + "metrics: {}\n")
    newer = NATIVE_CPU.replace("v0.32.0", "v0.33.0") + "metrics: {}\n"
    after = fingerprints(newer, wrapper="wrapper:2")
    assert [name for name in before if before[name] != after[name]] == ["serve"]
    assert {"front-door", "prometheus", "node-exporter"} <= before.keys()


def test_rays_metrics_port_is_off_unless_named_as_ray_binds_it_to_every_address() -> None:
    ray_cpu = NATIVE_CPU.replace("backend: native", "backend: ray")
    head = stacks(ray_cpu + "metrics: {}\n")["a"]
    assert "--metrics-export-port" not in head["services"]["ray"]["command"]
    scraped = yaml.safe_load(head["configs"]["prometheus-config"]["content"])
    assert [job["job_name"] for job in scraped["scrape_configs"]] == ["vllm", "front_door", "node"]


def test_the_doors_counts_come_from_mtail_on_the_heads_loopback_fed_its_log_lines() -> None:
    found = stacks(NATIVE_CPU + "vllm: {port: 8003}\nmetrics: {}\n")["a"]
    counts = found["services"]["front-door-counts"]
    assert counts["image"] == "ghcr.io/jaqx0r/mtail:3.4.9" and counts["network_mode"] == "host"
    # Slot 3: its own UDP port for the door's lines and HTTP port for Prometheus, on loopback.
    assert "--logs=udp://127.0.0.1:5143" in counts["command"]
    assert counts["command"][2:4] == ["--address=127.0.0.1", "--port=3913"]
    assert [c["target"] for c in counts["configs"]] == [doorcounts.PROGRAM_FILE]
    program = found["configs"][doorcounts.CONFIG]["content"]  # Compose reads $$ as $
    assert program.replace("$$", "$") == doorcounts.PROGRAM
    door = found["configs"][frontdoor.CONFIG]["content"]
    assert "    log 127.0.0.1:5143 format raw local0 info" in door.splitlines()
    assert "secrets" not in counts and "environment" not in counts
    # Without metrics, the door logs to its output alone and nothing counts.
    off = stacks(NATIVE_CPU)["a"]
    assert "front-door-counts" not in off["services"] and doorcounts.CONFIG not in off["configs"]
    assert "log 127.0.0.1" not in off["configs"][frontdoor.CONFIG]["content"]


def test_without_the_front_door_prometheus_scrapes_vllm_on_the_head_with_the_key() -> None:
    found = stacks(NATIVE_CPU + "metrics: {}\nfront_door: {enabled: false}\n")
    scraped = yaml.safe_load(found["a"]["configs"]["prometheus-config"]["content"])
    vllm = scraped["scrape_configs"][0]
    assert vllm["authorization"]["credentials_file"] == "/run/secrets/api_key"
    assert vllm["static_configs"][0]["targets"] == ["10.0.0.1:8000"]
    assert found["a"]["services"]["prometheus"]["secrets"] == ["api_key"]


def test_with_replicas_the_doors_head_alone_runs_prometheus_and_scrapes_every_replica() -> None:
    text = (CASES / "replicas.yaml").read_text() + "metrics: {}\n"
    cluster, found = config.parse(text), stacks(text)
    assert [n for n in found if "prometheus" in found[n]["services"]] == ["spark-1"]
    assert "prometheus-data" not in found["spark-3"].get("volumes", {})
    assert found["spark-1"]["services"]["prometheus"]["secrets"] == ["api_key"]
    scraped = yaml.safe_load(found["spark-1"]["configs"]["prometheus-config"]["content"])
    jobs = {job["job_name"]: job for job in scraped["scrape_configs"]}
    assert jobs["vllm"]["static_configs"] == [
        {"targets": ["127.0.0.1:8400"], "labels": {"node": "spark-1", "replica": "1"}},
        {"targets": ["192.168.200.14:30000"], "labels": {"node": "spark-3", "replica": "2"}},
    ]
    assert jobs["vllm"]["authorization"]["credentials_file"] == "/run/secrets/api_key"
    for job in ("node", "dcgm"):  # every node of every replica
        assert [c["labels"]["node"] for c in jobs[job]["static_configs"]] == [
            n.name for n in cluster.nodes
        ]
    # The door's counts: each replica's requests too, from its log lines.
    program = found["spark-1"]["configs"][doorcounts.CONFIG]["content"].replace("$$", "$")
    assert program == doorcounts.PROGRAM + doorcounts.REPLICAS
