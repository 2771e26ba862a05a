"""Faults made on the emulated nodes, for the tests and benchmarks.chaos: a container's first
process found to be killed from the host, a rank that hangs."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path

from tests.support import clusters, images
from tests.support.testbed import MODELS, Node, Testbed

BACK_WITHIN = 420  # seconds a group may take to serve again after a power cut (bounded wait)
MODEL = f"{MODELS}/{images.MODEL}"


def first_process(node: Node, project: str, service: str) -> int:
    """The service's container's first process, as the host sees it (a container this run
    started): a SIGKILL to it ends the container at once, where `docker kill` over the node's
    context takes seconds on a loaded machine."""
    pid = clusters.containers(node, project)[service].state.pid
    assert pid, f"{node.name}'s {service} container is not running"
    return pid


def descendants(pid: int) -> list[int]:
    """Every process under `pid` (host PIDs, from /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def ranks(init: int, backend: str) -> dict[int, str]:
    """pid -> command line of each rank process under the container's first process: Ray's
    processes (ray), or every one but the supervisor and the healthcheck (native)."""
    found = {}
    for pid in descendants(init):
        with contextlib.suppress(OSError):
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            own = "vllm-compose-health" in cmd
            if cmd.startswith("ray::") if backend == "ray" else not own:
                found[pid] = cmd
    return found


def hang_rank(node: Node, project: str, backend: str) -> None:
    """The node's rank stops (SIGSTOP) while its container, supervisor and Ray stay: no event, no
    exit, and the head's completions hang in a collective."""
    service = "ray" if backend == "ray" else "serve"
    init = first_process(node, project, service)
    worker = "RayWorker" if backend == "ray" else "VLLM::Worker"
    deadline = time.monotonic() + 60
    # The rank itself, not only what is around it (a vLLM between two starts has none).
    found = ranks(init, backend)
    while not any(worker in cmd for cmd in found.values()):
        assert time.monotonic() < deadline, f"no rank process to hang in 60 s: {found}"
        time.sleep(1)
        found = ranks(init, backend)
    for pid in found:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGSTOP)  # a process of a container this run started


def answers(node: Node, key: str) -> bool:
    """One chat completion, sent from `node` to the head's endpoint, comes back (20 s at most)."""
    request = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    found = node.nsexec(
        "curl", "-sf", "-m", "20", "http://192.168.200.12:30000/v1/chat/completions",
        "-H", f"Authorization: Bearer {key}", "-H", "Content-Type: application/json",
        "-d", json.dumps(request), check=False,
    )  # fmt: skip
    return found.returncode == 0 and '"chat.completion"' in found.stdout


def serving_again(node: Node, key: str) -> float:
    """Seconds until a completion comes back; fails after BACK_WITHIN."""
    start = time.monotonic()
    while time.monotonic() - start < BACK_WITHIN:
        if answers(node, key):
            return time.monotonic() - start
        time.sleep(0.5)  # no door listening yet (its node's power came back); the door holds
    raise AssertionError(f"not serving {BACK_WITHIN} s after the power came back")


def power_cut(bed: Testbed, nodes: list[Node]) -> None:
    """Power lost (engines and containers killed at once), then back."""
    bed.power_cut(nodes)
    for node in nodes:
        bed.start_engine(node)


def serve_starts(head: Node, project: str) -> int:
    """How often the supervisor in the head's serve has started vLLM so far."""
    log = str(head.docker.container.logs(f"{project}-serve-1"))
    return log.count("vllm-compose: starting vllm (start ")


def survives_power_cuts(bed: Testbed, path: Path, project: str, cuts: str) -> None:
    """A serving group's power cuts, one after another: `cuts` "both" (both nodes at once, where
    each side starts from nothing) or "alone" (the worker alone, then the head alone). After each,
    the same containers serve again with no command run. After the worker's cut the head's side of
    the group says it broke and started again with it: no rank keeps serving a group that lost a
    member. (Run on a group a test has serving already: a cold start of its own would test nothing
    more.)"""
    head, worker = bed.nodes[:2]
    key, before = clusters.api_key(path), clusters.ids([head, worker], project)
    for cut in [[head, worker]] if cuts == "both" else [[worker], [head]]:
        starts = serve_starts(head, project)
        power_cut(bed, cut)
        took = serving_again(worker, key)
        print(f"{project}: power cut of {', '.join(n.name for n in cut)}: serving in {took:.0f} s")
        assert clusters.ids([head, worker], project) == before  # restarted, never recreated
        # The head's serve never outlives a cut: after the worker's alone it started again too
        # (it saw the group break, or vLLM exited when its peer's connection closed).
        assert serve_starts(head, project) > starts
