"""The containers of a model copy on the nodes (operations/sync.py orchestrates them): a sender
on the source node serving the files on its private IP, and a receiver on a target that fetches
what it lacks and checks every file against the manifest, its progress followed."""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from python_on_whales import Container, DockerException

from generator.base import probes, units
from generator.base.errors import DockerError, reason
from generator.base.fanout import Report
from generator.config import Node
from generator.config.mounts import model_mount
from generator.nodes.fleet import Fleet

MANIFEST = "/tmp/vllm-compose-manifest.json"  # where a receiver finds the manifest


@dataclass
class Outcome:
    moved: int = 0
    kept: int = 0
    error: str | None = None


def sender(fleet: Fleet, source: Node, listen: str) -> Container:
    """The sender container, started on `source`, serving the model on `listen`."""
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


def remove(fleet: Fleet, node: Node, container: Container) -> None:
    with contextlib.suppress(DockerException):
        fleet.docker[node.name].container.remove(container.id, force=True)


def receive(
    fleet: Fleet, node: Node, listen: str, listing: Path, total: int, outcome: Outcome
) -> None:
    """A receiver container on `node` fetching the model from the sender on `listen`, the
    manifest (`listing`) copied into it, its progress said; how it ended goes into `outcome`."""

    def report(line: str) -> None:
        fleet.report(f"sync-model: {node.name}: {line}")

    try:
        _receive(fleet, node, listen, listing, total, outcome, report)
    except DockerException as e:
        outcome.error = reason(e)


def _receive(
    fleet: Fleet,
    node: Node,
    listen: str,
    listing: Path,
    total: int,
    outcome: Outcome,
    report: Report,
) -> None:
    path, docker = fleet.cluster.model.path, fleet.docker[node.name]
    receiver = docker.container.create(
        fleet.wrapper,
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
