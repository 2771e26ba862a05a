"""Where a starting vLLM is, read from its log: the phase a line begins, and progress within it.

`up` follows the head's serve log while it waits (operations/readiness.py) and says each phase as
it begins, instead of the probe's refusal every few seconds. The lines are vLLM's own (0.11 to
0.32, GPU and CPU builds) and those of our supervisor (image/group.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# vLLM's lines as torch.compile starts: the CPU build's warm-up, the GPU builds' cache folder and
# Dynamo's first figure (not any line that names torch.compile: some say it is off).
COMPILING = (
    r"Warming up model for the compilation|for vLLM's torch\.compile|Dynamo bytecode transform"
    r"|Compiling a graph for"
)
# (phase, what begins it), first match wins; order follows a start.
PHASES: list[tuple[str, re.Pattern[str]]] = [
    (phase, re.compile(pattern))
    for phase, pattern in [
        ("waiting for the group", r"vllm-compose: waiting for"),
        ("starting vLLM", r"vllm-compose: starting |non-default args:"),
        ("waiting for Ray's placement group", r"Waiting for creating a placement group"),
        ("initializing the engine", r"Initializing a V1 LLM engine"),
        ("loading weights", r"Starting to load model|Loading \w+ checkpoint shards"),
        ("compiling", COMPILING),
        ("profiling memory, sizing the KV cache", r"[Pp]rofiling|KV cache memory|KV cache size"),
        ("capturing graphs", r"Capturing CUDA graph"),
        ("API up", r"Starting vLLM (API )?server|Application startup complete"),
    ]
]
LAST = PHASES[-1][0]  # "API up"
# A Ray worker's lines in the driver's log name the worker's node when it is not the driver's,
# in colour: "\x1b[36m(RayWorkerProc pid=812, ip=192.168.200.13)\x1b[0m INFO ...". Ray drops a
# line that another worker logged too, unless RAY_DEDUP_LOGS=0 (serve sets it).
RAY_ORIGIN = re.compile(r"^(?:\x1b\[[0-9;]*m)?\(\w+ pid=\d+, ip=([0-9.]+)\)")
WITH_PERCENT = ("loading weights", "capturing graphs")  # tqdm's bars in these phases' lines
PERCENT = re.compile(r"(\d{1,3})%")


@dataclass(frozen=True)
class Seen:
    phase: str
    percent: int | None = None  # within the phase, when its line says

    def __str__(self) -> str:
        return self.phase if self.percent is None else f"{self.phase} {self.percent}%"


class PhaseLine(str):
    """A progress line that says a node's start phase ("serve: spark1: loading weights 45% (14
    s)"), with what it says as fields: cli/live.py shows them without reading the text back."""

    wait: str  # what is waited for: `serve`
    node: str
    seen: Seen
    done: bool  # the last phase: the API is up

    def __new__(cls, text: str, wait: str, node: str, seen: Seen) -> PhaseLine:
        line = super().__new__(cls, text)
        line.wait, line.node, line.seen, line.done = wait, node, seen, seen.phase == LAST
        return line


def read(line: str) -> Seen | None:
    """The phase this line belongs to, or None when it says nothing of one."""
    for phase, pattern in PHASES:
        if pattern.search(line):
            found = PERCENT.search(line) if phase in WITH_PERCENT else None
            return Seen(phase, int(found.group(1)) if found else None)
    return None


def origin(line: str) -> str | None:
    """The IP of the node a line of a Ray driver's log comes from, when it says."""
    found = RAY_ORIGIN.match(line)
    return found.group(1) if found else None


@dataclass
class Tracker:
    """The phases of one start as its lines come: which one it is in, since when."""

    now: Seen | None = None
    since: float = 0.0

    def advance(self, line: str, at: float) -> Seen | None:
        """The line's phase when it begins a new one (None for the same phase or no phase)."""
        seen = read(line)
        if seen is None:
            return None
        if self.now is not None and seen.phase == self.now.phase:
            self.now = seen  # progress within the phase
            return None
        self.now, self.since = seen, at
        return seen
