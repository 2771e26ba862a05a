"""What a failed group leaves behind: before `watch` recreates a group or takes it down, and
before `up` rolls a failed start back, every node's container logs are saved in a folder beside
the config, so the cause outlives the containers."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from generator.config import Node
from generator.errors import reason
from generator.fanout import each
from generator.fleet import Fleet
from generator.output import write_atomic

LINES = 20000  # per node: the last lines of every service, enough for a vLLM start and its end
TIMEOUT = 30  # per node


def save_logs(fleet: Fleet, root: Path, why: str) -> None:
    """Every node's services' logs (timestamped, exited containers too) into root/<UTC time>/
    <node>.log; says where, or why a node's could not be read. Never fails the caller."""
    folder = root / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())

    def save(node: Node) -> Callable[[], None]:
        def run() -> None:
            text = fleet.all_logs(node, LINES)
            folder.mkdir(parents=True, exist_ok=True)
            write_atomic(folder / f"{node.name}.log", text)

        return run

    outcome = each({n.name: save(n) for n in fleet.cluster.nodes}, TIMEOUT)
    failed = [f"{n}: {reason(e)}" for n, e in outcome.items() if isinstance(e, BaseException)]
    saved = len(outcome) - len(failed)
    fleet.report(f"{why}: logs of {saved} node(s) saved in {folder}")
    for line in failed:
        fleet.report(f"{why}: logs not saved: {line}")
