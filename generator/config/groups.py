"""How the nodes make up groups: each group's TP x PP over its own nodes, and with `replicas`
the nodes shared out between the groups (config.Cluster.groups)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from generator.config import Cluster


def problems(c: Cluster) -> list[str]:
    """Replicas: the nodes shared out evenly, each share's first node its head, the door on to
    balance them; then each replica's parallel layout over its own share."""
    n, size = c.replicas, len(c.members)
    if n == 1:
        return _parallel_problems(c, "the nodes")
    if len(c.nodes) % n:
        return [f"replicas: {n} groups do not divide {len(c.nodes)} nodes; give each replica as"
                " many nodes (each share's first node is its head)"]  # fmt: skip
    found = [
        f"nodes.{i}.role: with replicas each share's first node is its head; leave `role` out"
        for i, node in enumerate(c.nodes)
        if node.role and node.role != ("head" if i == 0 else "worker" if i % size else "")
    ]
    if not c.front_door.enabled:
        found.append("front_door.enabled: the front door balances the replicas; turn it on, or"
                     " set replicas: 1")  # fmt: skip
    for group in c.groups:
        found += _parallel_problems(group, f"replica {group.replica + 1}'s nodes")
    return found


def _parallel_problems(c: Cluster, nodes: str) -> list[str]:
    tp, pp = c.tensor_parallel_size, c.vllm.pipeline_parallel_size
    if tp * pp > c.gpu_total:
        return [
            f"vllm.tensor_parallel_size: TP {tp} x PP {pp} = {tp * pp} GPUs asked for,"
            f" {nodes} have {c.gpu_total}"
        ]
    if c.backend == "native" and (tp * pp) % len(c.nodes):
        return [
            f"vllm.tensor_parallel_size: TP {tp} x PP {pp} = {tp * pp} ranks do not divide over"
            f" {len(c.nodes)} nodes; the native backend runs as many on each node"
        ]
    return []
