"""`vllm-compose verify`: every model file on every node hashed (sha256, all nodes at once, with
progress) and compared with the lock's manifest, or with the head's files when there is no lock;
each mismatch named. A node found right is stamped (stamps.py), so preflight names a file changed
since without hashing."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from generator.base.errors import VllmComposeError, reason
from generator.base.fanout import each
from generator.base.manifest import differences
from generator.config import Node
from generator.nodes.fleet import Fleet
from generator.operations import stamps
from generator.operations.lock import Lock

TIMEOUT = 6 * 3600  # per node: hashing a few hundred GB from a slow disk


def verify(fleet: Fleet, locked: Lock | None, config: Path) -> tuple[list[str], int]:
    """Each mismatch as a line naming the node and the file (none: every node holds the model
    exactly), and how many files were checked per node."""
    fleet.contexts_answer(30)
    fleet.images()
    path, nodes = fleet.cluster.model.path, fleet.cluster.nodes

    def hash_on(node: Node) -> Callable[[], dict[str, Any]]:
        return lambda: dict(fleet.manifest(node)["files"])

    fleet.report(f"verify: hashing every file of {path} on {', '.join(n.name for n in nodes)}")
    found = each({n.name: hash_on(n) for n in nodes}, TIMEOUT, fleet.report, "verify: hashing")
    head = found[fleet.head.name]
    if locked:
        want, against = locked.model.model_dump()["files"], "the lock"
    elif isinstance(head, BaseException):
        raise VllmComposeError(f"verify: {fleet.head.name}: {reason(head)}")
    else:
        want, against = head, f"{fleet.head.name}'s"
    problems: list[str] = []
    taken: dict[str, stamps.Recorded | None] = {}
    for node in nodes:
        outcome = found[node.name]
        if isinstance(outcome, BaseException):
            wrong, taken[node.name] = [reason(outcome)], None
        else:
            wrong = mismatches(want, outcome, against)
            taken[node.name] = None if wrong else _stamps_of(outcome)
        problems += [f"{node.name}: {line}" for line in wrong]
    stamps.record(config, path, taken)
    return problems, len(want)


def mismatches(want: dict[str, Any], have: dict[str, Any], against: str) -> list[str]:
    """Per file: missing, extra, of another size, or of another sha256 than `want`'s."""
    sizes = differences(
        {n: f["size"] for n, f in want.items()}, {n: f["size"] for n, f in have.items()}
    )
    found = [
        f"{name}: {label}"
        for label, names in sizes.labelled("missing", f"not in {against}", "size differs")
        for name in names
    ]
    same_size = set(want) & set(have) - set(sizes.size)
    found += [
        f"{name}: sha256 differs from {against}"
        for name in sorted(same_size)
        if want[name]["sha256"] != have[name]["sha256"]
    ]
    return found


def _stamps_of(files: dict[str, Any]) -> stamps.Recorded:
    return {name: (f["size"], f["mtime_ns"]) for name, f in files.items()}
