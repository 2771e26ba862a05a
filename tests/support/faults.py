"""Faults made on the emulated nodes, for the tests and benchmarks.chaos: a container's first
process found to be killed from the host, a rank that hangs."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from tests.support import clusters
from tests.support.testbed import Node


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
