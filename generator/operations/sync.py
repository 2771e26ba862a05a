"""Copy the model from one node to the others, node to node over the private link.

The controller only orchestrates: a sender container on the source node serves the files
(symlinks followed, so an HF cache's snapshot arrives as real files) on its private IP; one
receiver container per target, all at once, fetches what it lacks and checks every file against the
manifest (size and sha256) before it takes its place. Correct files are kept, so a second run moves
nothing; a copy that fails any check never reports success.
"""

from __future__ import annotations

import json
import random
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from generator.base.fanout import each
from generator.config import Node
from generator.nodes import copies
from generator.nodes.copies import Outcome
from generator.nodes.fleet import Fleet
from generator.operations.lock import Lock


def sync_model(fleet: Fleet, source: Node, locked: Lock | None) -> dict[str, Outcome]:
    """The model from `source` to every other node, verified against the lock's manifest when
    there is a lock, else against the source's, hashed first."""
    fleet.contexts_answer(30)
    fleet.images()
    if locked:
        # The lock's hashes are the truth: each receiver checks every file against them, so the
        # source is not read twice (a source that differs fails its receivers' checks).
        manifest: dict[str, Any] = {"files": locked.model.model_dump()["files"]}
    else:
        fleet.report(f"sync-model: hashing {fleet.cluster.model.path} on {source.name}")
        manifest = fleet.manifest(source)
    return sync(fleet, source, manifest)


def sync(fleet: Fleet, source: Node, manifest: dict[str, Any]) -> dict[str, Outcome]:
    # Below the ephemeral ports, above every cluster's group port (generator/config/ports.py).
    listen = f"{source.ip}:{random.randint(29700, 29999)}"
    sender = copies.sender(fleet, source, listen)
    targets = [n for n in fleet.cluster.nodes if n != source]
    outcomes = {n.name: Outcome() for n in targets}
    try:  # the receivers start at once: they retry until the sender listens
        with tempfile.NamedTemporaryFile("w", suffix=".json") as listing:
            json.dump(manifest, listing)
            listing.flush()
            total = sum(f["size"] for f in manifest["files"].values())
            listed = Path(listing.name)
            work: dict[str, Callable[[], None]] = {
                n.name: partial(copies.receive, fleet, n, listen, listed, total, outcomes[n.name])
                for n in targets
            }
            each(work, float("inf"))
    finally:
        copies.remove(fleet, source, sender)
    return outcomes
