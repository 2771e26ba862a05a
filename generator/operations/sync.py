"""Copy the model from one node to the others, node to node over the private link.

The controller only orchestrates: a sender container on the source node serves the files
(symlinks followed, so an HF cache's snapshot arrives as real files) on its private IP; one
receiver container per target, all at once, fetches what it lacks and checks every file against the
manifest (size and sha256) before it takes its place. Correct files are kept, so a second run moves
nothing; a copy that fails any check never reports success.
"""

from __future__ import annotations

import contextlib
import json
import random
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from python_on_whales import Container, DockerClient, DockerException

from generator.base import probes, units
from generator.base.errors import DockerError, reason
from generator.base.fanout import Report, each
from generator.config import Node
from generator.config.mounts import model_mount
from generator.nodes.fleet import Fleet
from generator.operations.lock import Lock

MANIFEST = "/tmp/vllm-compose-manifest.json"  # where a receiver finds the manifest


@dataclass
class Outcome:
    moved: int = 0
    kept: int = 0
    error: str | None = None


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
    path = fleet.cluster.model.path
    # Below the ephemeral ports, above every cluster's group port (generator/config/ports.py).
    listen = f"{source.ip}:{random.randint(29700, 29999)}"
    sender = _sender(fleet, source, listen)
    targets = [n for n in fleet.cluster.nodes if n != source]
    outcomes = {n.name: Outcome() for n in targets}
    try:  # the receivers start at once: they retry until the sender listens
        with tempfile.NamedTemporaryFile("w", suffix=".json") as listing:
            json.dump(manifest, listing)
            listing.flush()
            total = sum(f["size"] for f in manifest["files"].values())
            work = {
                n.name: _receiver(fleet, n, path, listen, Path(listing.name), total, outcomes)
                for n in targets
            }
            each(work, float("inf"))
    finally:
        with contextlib.suppress(DockerException):
            fleet.docker[source.name].container.remove(sender.id, force=True)
    return outcomes


def _sender(fleet: Fleet, source: Node, listen: str) -> Container:
    mount = model_mount(fleet.cluster.model.path)
    try:
        sender = fleet.docker[source.name].run(
            fleet.wrapper,
            probes.send(fleet.cluster.model.path, listen)[1:],
            entrypoint=probes.HEALTH,
            detach=True,
            remove=True,
            networks=["host"],
            volumes=[(mount, mount, "ro")],
            labels={"io.vllm-compose.cluster": fleet.cluster.name, "io.vllm-compose.role": "sync"},
        )
        assert isinstance(sender, Container)  # detached: the container, not its output
        return sender
    except DockerException as e:
        raise DockerError.wrap(source.name, "the model sender failed", e) from None


def _receiver(
    fleet: Fleet,
    node: Node,
    path: str,
    listen: str,
    listing: Path,
    total: int,
    outcomes: dict[str, Outcome],
) -> Callable[[], None]:
    def run() -> None:
        outcome = outcomes[node.name]
        docker = fleet.docker[node.name]

        def report(line: str) -> None:
            fleet.report(f"sync-model: {node.name}: {line}")

        try:
            _receive(docker, fleet.wrapper, path, listen, listing, total, outcome, report)
        except DockerException as e:
            outcome.error = reason(e)

    return run


def _receive(
    docker: DockerClient,
    image: str,
    path: str,
    listen: str,
    listing: Path,
    total: int,
    outcome: Outcome,
    report: Report,
) -> None:
    """A receiver container on the node, the manifest copied into it, its progress followed."""
    receiver = docker.container.create(
        image,
        probes.receive(path, listen, MANIFEST)[1:],
        entrypoint=probes.HEALTH,
        networks=["host"],
        volumes=[(path, path)],
    )
    try:
        docker.copy(listing, (receiver, MANIFEST))
        docker.container.start(receiver)
        last = 0.0
        for chunk in docker.container.logs(receiver, follow=True, stream=True):
            raw = chunk[1]  # streamed: (source, bytes) pairs
            assert isinstance(raw, bytes)
            for line in raw.decode(errors="replace").splitlines():
                event = _event(line)
                if event.get("done"):
                    outcome.moved, outcome.kept = event["moved"], event["kept"]
                elif "moved" in event and time.monotonic() - last > 2:
                    report(f"{units.size(event['moved'])} of up to {units.size(total)}")
                    last = time.monotonic()
        if docker.container.wait(receiver) != 0:
            outcome.error = _last_error(str(docker.container.logs(receiver)))
    finally:
        with contextlib.suppress(DockerException):
            docker.container.remove(receiver, force=True)


def _event(line: str) -> dict[str, Any]:
    try:
        found = json.loads(line)
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def _last_error(log: str) -> str:
    """The receiver's own last word (it prints `vllm-compose-health: ...` on stderr)."""
    said = [line for line in log.splitlines() if line.startswith(f"{probes.HEALTH}: ")]
    return said[-1] if said else "the receiver failed"
