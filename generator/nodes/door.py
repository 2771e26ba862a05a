"""The front door on the head's engine: kept running while its group goes down and comes back
(a request it holds is answered by the group that comes back), and told to read its keys again."""

from __future__ import annotations

from collections.abc import Callable

from generator.base.errors import reason
from generator.base.fanout import each
from generator.config import Node
from generator.nodes.fleet import DOWN_TIMEOUT, Fleet

NAME = "front-door"  # its service (stack/frontdoor.py)


def group_down(
    fleet: Fleet, nodes: list[Node] | None = None, stop: int | None = None
) -> dict[str, str]:
    """Like Fleet.down without volumes, but the front door stays: every other service of each
    node (or those given) stopped (`stop`: seconds after SIGTERM) and removed, all nodes at once;
    node -> 'removed' ('removed, the front door kept' on the head) or why it is not clean."""

    def one(node: Node) -> Callable[[], object]:
        stack = fleet.stacks[node.name]
        names = [s.name for s in stack.services] + [s.name for s in stack.sidecars]
        names = [n for n in names if n != NAME]
        docker = fleet.docker[node.name]

        def run() -> None:
            docker.compose.stop(names, timeout=stop)
            docker.compose.rm(names, stop=True)

        return run

    chosen = fleet.cluster.nodes if nodes is None else nodes
    outcome = each({n.name: one(n) for n in chosen}, DOWN_TIMEOUT)
    kept = fleet.head.name if fleet.cluster.front_door.enabled else None
    return {
        name: f"failed: {reason(found)}"
        if isinstance(found, BaseException)
        else "removed, the front door kept"
        if name == kept
        else "removed"
        for name, found in outcome.items()
    }


def reload(fleet: Fleet) -> None:
    """HAProxy's master reloads on SIGUSR2: a new worker with the files read again, the old one
    finishing what it holds (nothing in flight is dropped)."""
    for container in fleet.docker[fleet.head.name].compose.ps(services=[NAME]):
        fleet.docker[fleet.head.name].container.kill(container, signal="USR2")


def renewed(fleet: Fleet) -> None:
    """After the secrets were written (a rotated API key is the admin key's new hash): the front
    door, when it runs, reads its keys again."""
    if fleet.cluster.front_door.enabled and fleet.running(fleet.head, NAME):
        reload(fleet)
        fleet.report(f"secrets: {fleet.head.name}: the front door reads its keys again")
