"""One node's engine, for what an operation needs beyond the group-wide calls of `Fleet`: its
containers' resource use, its stack's log. Operations reach a node's engine
through here and `Fleet`, never through a client of their own."""

from __future__ import annotations

from collections.abc import Iterator

from python_on_whales import Container
from python_on_whales.components.container.cli_wrapper import ContainerStats

from generator.config import Node
from generator.nodes.fleet import Fleet


def stats(fleet: Fleet, node: Node, running: list[Container]) -> list[ContainerStats]:
    """CPU and memory use of `running` containers on `node`, one reading each."""
    return fleet.docker[node.name].container.stats(running)


def log_chunks(fleet: Fleet, node: Node, follow: bool) -> Iterator[bytes]:
    """The node's stack's log as Compose streams it (every service's lines, prefixed)."""
    for _, chunk in fleet.docker[node.name].compose.logs(follow=follow, stream=True):
        yield chunk
