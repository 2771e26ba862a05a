"""Every port a cluster's stacks open, so that several clusters share nodes without a clash.

Clusters that share a node need distinct API ports (`vllm.port`); every other port follows from
its last two digits, the cluster's slot (8000 and 30000: slot 0, today's defaults; 8001: slot 1),
unless the config names it. Ray's own ports are all named on its command line (by default Ray
picks some at random and others fixed, which two Ray clusters on one node would share).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from generator.config import Cluster

SLOTS = 100
WORKER_PORTS = 99  # Ray worker processes per node and cluster: 10002 + 99 * slot onwards
BEHIND_DOOR = 8400  # vLLM on loopback behind the front door: 8400 + slot (clear of 8000 + slot)
BEHIND_DOOR_NAME = "vLLM behind the front door"  # its name in `opened`
DOOR_COUNTS_NAME = "the front door's counts (mtail)"  # its name in `opened`


def slot(c: Cluster) -> int:
    return c.vllm.port % SLOTS


def vllm(c: Cluster) -> int:
    """Where vLLM itself listens on the head: behind the front door, a loopback port of the
    slot (clients use `vllm.port`, the front door's); without it, `vllm.port`."""
    return BEHIND_DOOR + slot(c) if c.front_door.enabled else c.vllm.port


def door_counts(c: Cluster) -> int:
    """mtail's HTTP port on the head's loopback, where Prometheus reads the front door's counts
    per key (clear of 3903, mtail's own default, for slot 0 too)."""
    return 3910 + slot(c)


def door_log(c: Cluster) -> int:
    """The UDP port on the head's loopback where the front door sends mtail its log lines."""
    return 5140 + slot(c)


def ray_gcs(c: Cluster) -> int:
    return c.ray.port or 6379 + slot(c)


def group(c: Cluster) -> int:
    return c.group.port or 29510 + slot(c)


def master(c: Cluster) -> int:
    """Downwards from 29501, clear of the group ports above 29510."""
    return c.vllm.master_port or 29501 - slot(c)


def ray_dashboard(c: Cluster) -> int:
    return 8265 + slot(c)


def ray_internal(c: Cluster, head: bool) -> dict[str, int]:
    """`ray start` option -> port, for a node's Ray (the head's serves Ray's client too)."""
    k = slot(c)
    ports = {
        "--node-manager-port": 6500 + k,
        "--object-manager-port": 6600 + k,
        "--dashboard-agent-grpc-port": 6700 + k,
        "--runtime-env-agent-port": 6800 + k,
        "--dashboard-agent-listen-port": 52365 + k,
        "--min-worker-port": 10002 + WORKER_PORTS * k,
        "--max-worker-port": 10002 + WORKER_PORTS * k + WORKER_PORTS - 1,
    }
    if head:
        ports["--ray-client-server-port"] = 6900 + k
    return ports


def ray_metrics(c: Cluster) -> dict[str, int]:
    """The head's own metrics servers of a Ray with its dashboard extra (its autoscaler's and its
    dashboard's), which Ray binds to every address; variable -> port. Apart for every slot."""
    k = slot(c)
    return {"AUTOSCALER_METRIC_PORT": 44217 - k, "DASHBOARD_METRIC_PORT": 44227 + k}


def ray_environment(c: Cluster) -> dict[str, str]:
    """What Ray's processes read at start: the metrics ports of the slot, and each node's metrics
    export (a random port on every address) off unless `metrics.ray_port` asks for it."""
    env = {name: str(port) for name, port in ray_metrics(c).items()}
    if not (c.metrics and c.metrics.ray_port):
        env["RAY_enable_metrics_collection"] = "false"
    return env


def opened(c: Cluster) -> dict[str, int]:
    """The fixed ports the stacks open on their nodes, by the setting (or Ray option) that
    names them; Ray's worker range by its first port."""
    found = {"vllm.port": c.vllm.port, "group.port": group(c)}
    if c.front_door.enabled:
        found[BEHIND_DOOR_NAME] = vllm(c)
    if c.backend == "ray":
        found["ray.port"] = ray_gcs(c)
        if c.ray.dashboard:
            found["Ray's dashboard (ray.dashboard)"] = ray_dashboard(c)
        internal = ray_internal(c, head=True)
        found |= {f"Ray's {option}": port for option, port in internal.items()}
        found |= {f"Ray's {name}": port for name, port in ray_metrics(c).items()}
    else:
        found["vllm.master_port"] = master(c)
    if c.metrics:
        found["metrics.port"] = c.metrics.port
        found["metrics.node_exporter_port"] = c.metrics.node_exporter_port
        if c.front_door.enabled:
            found[DOOR_COUNTS_NAME] = door_counts(c)
        if c.backend == "ray" and c.metrics.ray_port:
            found["metrics.ray_port"] = c.metrics.ray_port
        if c.accelerator == "nvidia":
            found["metrics.dcgm_port"] = c.metrics.dcgm_port
    return found


def ranges(c: Cluster) -> dict[str, range]:
    """`opened`, each as the ports it spans (Ray's worker range is 99 wide)."""
    found = {name: range(port, port + 1) for name, port in opened(c).items()}
    first = found.pop("Ray's --min-worker-port", None)
    found.pop("Ray's --max-worker-port", None)
    if first is not None:
        found["Ray's worker ports"] = range(first.start, first.start + WORKER_PORTS)
    return found


def overlap(a: range, b: range) -> bool:
    """Do two spans of ports share a port?"""
    return a.start < b.stop and b.start < a.stop
