"""The `metrics` section's services: Prometheus on the head, a node exporter on every node, NVIDIA's
DCGM exporter on every node with `accelerator: nvidia`; and what Prometheus scrapes (those, vLLM's
/metrics with the API key, and Ray's metrics export port on each Ray node when `metrics.ray_port`
names it). Every one of ours listens on its node's private IP only, Prometheus where
`metrics.listen` says; Ray binds its metrics port to every address, hence off by default."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import yaml

from generator.config import ports

if TYPE_CHECKING:
    from generator.config import Cluster, Metrics, Node
    from generator.stack import NodeStack

PROMETHEUS_CONFIG = "prometheus-config"
PROMETHEUS_DATA = "prometheus-data"
PROMETHEUS_FILE = "/etc/prometheus/prometheus.yml"
# Compose mounts a service's secrets at /run/secrets/<name>.
API_KEY_FILE = "/run/secrets/api_key"
DCGM_COUNTERS = "dcgm-counters"
DCGM_COUNTERS_FILE = "/etc/dcgm-exporter/vllm-compose.csv"
# The exporter's default fields that tell heat, power and throttling; its two throttle counters
# it leaves off by default (time spent slowed for power and for heat); and the clock event
# reasons (NVML's bitmask: 0x4 power cap, 0x20 and 0x40 heat). Each name is one the exporter's
# own files and tests use: it refuses a name it does not know. A unified-memory GPU (GB10) has no
# framebuffer figures; the node exporter's node_memory_* are its memory.
DCGM_FIELDS = (
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "gauge", "Current clock event reasons (NVML bitmask)."),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_POWER_VIOLATION", "counter", "Throttling duration due to power (in us)."),
    ("DCGM_FI_DEV_THERMAL_VIOLATION", "counter", "Throttling duration due to heat (in us)."),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB; none on unified memory)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB; none on unified memory)."),
)


@dataclass(frozen=True)
class Sidecar:
    """A service beside the group, on an image of its own: nothing waits for it, and the group's
    checks leave it out (`watch` starts one that is down again alone, and recreates it with the
    group)."""

    name: str
    image: str
    command: list[str]
    user: str | None = None  # None: the image's own
    pid_host: bool = False
    all_gpus: bool = False
    volumes: list[str] = field(default_factory=list)  # named volumes, "name:/path"
    secrets: list[str] = field(default_factory=list)
    configs: list[tuple[str, str]] = field(default_factory=list)
    fingerprint: str = ""  # set by NodeStack.sidecars


def sidecars(stack: NodeStack) -> list[Sidecar]:
    """The node's metrics services (none without a `metrics` section)."""
    m, c, ip = stack.cluster.metrics, stack.cluster, str(stack.node.ip)
    if m is None:
        return []
    found = [
        # In the node's PID and network namespaces, its /proc and /sys are the node's: no host
        # folder is mounted (the node's / would hold the engine's socket). Filesystems are the
        # container's own.
        Sidecar(
            "node-exporter",
            m.node_exporter_image,
            [f"--web.listen-address={ip}:{m.node_exporter_port}"],
            pid_host=True,
        )
    ]
    if c.accelerator == "nvidia":
        found.append(
            Sidecar(
                "dcgm-exporter",
                m.dcgm_exporter_image,
                ["-a", f"{ip}:{m.dcgm_port}", "-f", DCGM_COUNTERS_FILE],
                all_gpus=True,  # no SYS_ADMIN: DCGM's profiling (DCP) metrics stay off
                configs=[(DCGM_COUNTERS, DCGM_COUNTERS_FILE)],
            )
        )
    if stack.runs_prometheus:
        keyed = not c.front_door.enabled or c.replicas > 1
        found.append(_prometheus(m, str(m.listen or ip), keyed=keyed))
    return found


def _prometheus(m: Metrics, listen: str, keyed: bool) -> Sidecar:
    """Prometheus; `keyed`: it sends the API key to vLLM (none behind the front door)."""
    return Sidecar(
        "prometheus",
        m.prometheus_image,
        [
            f"--config.file={PROMETHEUS_FILE}",
            "--storage.tsdb.path=/prometheus",
            f"--storage.tsdb.retention.time={m.retention}",
            f"--web.listen-address={listen}:{m.port}",
        ],
        # The API key's file is root's (mode 0600, mounted by Compose as it is on the node).
        user="0",
        volumes=[f"{PROMETHEUS_DATA}:/prometheus"],
        secrets=["api_key"] if keyed else [],
        configs=[(PROMETHEUS_CONFIG, PROMETHEUS_FILE)],
    )


def dcgm_counters() -> str:
    """The DCGM exporter's fields (its CSV: field, Prometheus type, help)."""
    return "".join(f"{name}, {kind}, {words}\n" for name, kind, words in DCGM_FIELDS)


KEYED = {"type": "Bearer", "credentials_file": API_KEY_FILE}  # a vLLM job's authorization


def prometheus_config(c: Cluster) -> str:
    """prometheus.yml: every target by its private IP, labelled with its node's name; with
    replicas, the first's Prometheus scrapes every replica's vLLM (labelled with its replica too)
    and every node."""
    m = c.metrics
    assert m is not None
    shares = c.replica_nodes
    everyone = [n for share in shares for n in share]
    head = {"node": c.head.name}
    if len(shares) > 1:  # the door's own vLLM on the loopback, the others' at their heads' IPs
        own = f"127.0.0.1:{ports.vllm(c)}"
        targets = [own, *(f"{share[0].ip}:{c.vllm.port}" for share in shares[1:])]
        vllm: dict[str, object] = {"job_name": "vllm", "static_configs": [
            {"targets": [t], "labels": {"node": share[0].name, "replica": str(i + 1)}}
            for i, (t, share) in enumerate(zip(targets, shares, strict=True))
        ], "authorization": KEYED}  # fmt: skip
    elif c.front_door.enabled:  # vLLM on the head's loopback, where Prometheus runs
        loopback = {"targets": [f"127.0.0.1:{ports.vllm(c)}"], "labels": head}
        vllm = {"job_name": "vllm", "static_configs": [loopback]}
    else:
        vllm = _job("vllm", [c.head], c.vllm.port)
        vllm["authorization"] = KEYED
    jobs = [vllm]
    if c.front_door.enabled:  # its counts per key, from mtail on the head's loopback
        counts = {"targets": [f"127.0.0.1:{ports.door_counts(c)}"], "labels": head}
        jobs.append({"job_name": "front_door", "static_configs": [counts]})
    jobs.append(_job("node", everyone, m.node_exporter_port))
    if c.backend == "ray" and m.ray_port:
        jobs.append(_job("ray", everyone, m.ray_port))
    if c.accelerator == "nvidia":
        jobs.append(_job("dcgm", everyone, m.dcgm_port))
    interval = f"{m.scrape_interval}s"
    timeout = f"{min(m.scrape_interval, 10)}s"
    scrape = {"scrape_interval": interval, "scrape_timeout": timeout}
    config = {"global": scrape, "scrape_configs": jobs}
    return yaml.safe_dump(config, sort_keys=False)


def _job(name: str, nodes: list[Node], port: int) -> dict[str, object]:
    targets = [{"targets": [f"{n.ip}:{port}"], "labels": {"node": n.name}} for n in nodes]
    return {"job_name": name, "static_configs": targets}
