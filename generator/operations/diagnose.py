"""Name why a service failed from its log, so the error says the cause instead of "exited (1)".

vLLM logs the root cause first and then a chain of wrappers ("Engine core initialization failed.
See root cause above"), so the first exception line of the log is the one to show.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from generator.config import Cluster

# vLLM's prefix: "(EngineCore pid=327) ERROR 11-30 10:07:08 [core.py:1510] "; then a traceback's
# last line, which starts the (rest of the) line: a warning quoting an error name does not count.
PREFIX = r"^(?:\(\w+ pid=\d+\)\s+)?(?:[A-Z]+ \d\d-\d\d [\d:]+ \[[^\]]+\]\s+)?"
EXCEPTION = re.compile(PREFIX + r"((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception)): (\S.*)$")


def cause(log: str) -> str | None:
    """The first exception line in the log ("ValueError: ..."), or None."""
    for line in log.splitlines():
        found = EXCEPTION.match(line)
        if found:
            return f"{found.group(1)}: {found.group(2).strip()}"
    return None


@dataclass(frozen=True)
class Guard:
    """A log line that means the start will not succeed, however long one waits."""

    marker: str  # a regular expression searched in each line
    cause: str
    hint: str


# Variables that must keep each node's own value on that node's ranks (stack.per_node_environment
# and the hardware ones), whatever vLLM's Ray executor copies from the head.
PER_NODE = "|".join(("VLLM_HOST_IP", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_HCA"))


PLACEMENT = Guard(
    "Waiting for creating a placement group",
    "Ray cannot place vLLM's workers (vLLM waits 1800 s before it says so): fewer nodes or "
    "GPUs joined than TP x PP needs, or a node registered another IP than VLLM_HOST_IP",
    "vllm-compose status CONFIG shows which node is not alive in Ray at its IP",
)

GUARDS = [
    PLACEMENT,
    Guard(
        f"Overwriting environment variable ({PER_NODE}) ",
        "vLLM's Ray executor overwrote a worker's per-node variable with the head's value, so that "
        "rank would use another node's interface or address (the field's silent hang)",
        "the stacks list these in ray_non_carry_over_env_vars.json under VLLM_CONFIG_ROOT; check "
        "the image does not move VLLM_CONFIG_ROOT or read that file from elsewhere",
    ),
    Guard(
        "Ray killed this worker",
        "Ray's memory monitor killed a worker during the load",
        "RAY_memory_monitor_refresh_ms=0 on every node (vllm-compose sets it unless env overrides)",
    ),
]


def guard(line: str) -> Guard | None:
    """The guard this log line trips, if any."""
    return next((g for g in GUARDS if re.search(g.marker, line)), None)


def group_placed(cluster: Cluster, slots: Mapping[str, Mapping[str, float]]) -> bool:
    """Do placement groups, made or reserved on their nodes, hold every GPU slot vLLM asks for
    (TP x PP)? Then its group was placed after it said it waits: a slow placement (raylets short
    of CPU), not a stuck one."""
    wanted = cluster.tensor_parallel_size * cluster.vllm.pipeline_parallel_size
    return sum(seen.get("placed", 0) for seen in slots.values()) >= wanted


def placement_shortfall(cluster: Cluster, slots: Mapping[str, Mapping[str, float]]) -> list[str]:
    """Why Ray cannot place vLLM's workers, node by node, from every alive Ray node's GPU slots
    (IP -> {"gpus": total, "free": free now}): a node not alive at its IP, or with fewer slots
    free than it contributes."""
    found = []
    for node in cluster.nodes:
        seen = slots.get(str(node.ip))
        if seen is None:
            alive = ", ".join(sorted(slots)) or "none"
            found.append(f"{node.name} is not alive in Ray at {node.ip} (alive: {alive})")
        elif seen["free"] < node.gpus:
            held = "held by another Ray job" if seen["gpus"] >= node.gpus else "declared"
            found.append(f"{node.name} has {seen['free']:g} of {node.gpus} GPU slots free ({held})")
    return found
