"""Name why a service failed from its log, so the error says the cause instead of "exited (1)".

vLLM logs the root cause first and then a chain of wrappers ("Engine core initialization failed.
See root cause above"), so the first exception line of the log is the one to show.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

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

    marker: str
    cause: str
    hint: str


GUARDS = [
    Guard(
        "Waiting for creating a placement group",
        "Ray cannot place vLLM's workers (vLLM waits 1800 s before it says so): fewer nodes or "
        "GPUs joined than TP x PP needs, or a node registered another IP than VLLM_HOST_IP",
        "vllm-compose status CONFIG shows which node is not alive in Ray at its IP",
    ),
    Guard(
        "Overwriting environment variable NCCL_",
        "vLLM overwrote an NCCL_ variable the stack set, so NCCL runs with other settings than "
        "configured (the field's silent hang)",
        "find who sets it (the image's ENV or vLLM's defaults); set it once, in the config's env",
    ),
    Guard(
        "Ray killed this worker",
        "Ray's memory monitor killed a worker during the load",
        "RAY_memory_monitor_refresh_ms=0 on every node (vllm-compose sets it unless env overrides)",
    ),
]


def guard(line: str) -> Guard | None:
    """The guard this log line trips, if any."""
    return next((g for g in GUARDS if g.marker in line), None)
