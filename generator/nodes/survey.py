"""Every cluster found on a set of nodes (their Docker contexts), from its containers' labels."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from python_on_whales import Container, DockerClient

from generator.base.errors import reason
from generator.base.fanout import Report, each
from generator.stack import claims

if TYPE_CHECKING:
    from generator.config import Cluster
    from generator.config.sections import Node

TIMEOUT = 30  # per context
Seen = dict[str, dict[str, claims.Claim]]  # node -> cluster -> its claim there


def clusters(contexts: list[str]) -> tuple[dict[str, claims.Claim], dict[str, str]]:
    """cluster -> its claim (nodes, services and their states), and context -> why it did not
    answer. Every context at once."""

    answered, failed = _split(each({ctx: _look(ctx) for ctx in dict.fromkeys(contexts)}, TIMEOUT))
    return claims.found(answered), failed


def on_nodes(nodes: list[Node], stopped: bool = False) -> Seen:
    """node -> cluster -> claim, the clusters running on each node (with `stopped`, those whose
    containers are all stopped too). Every node at once; one that does not answer is left out
    (the command's own steps name it)."""
    return look(nodes, stopped)[0]


def look(
    nodes: list[Node], stopped: bool = False, report: Report | None = None
) -> tuple[Seen, dict[str, str]]:
    """`on_nodes`, and node -> why its engine did not answer. With `report`, says every few
    seconds which nodes it still waits for."""
    work = {n.name: _look(n.docker_context) for n in nodes}
    answered, failed = _split(each(work, TIMEOUT, report, "contexts"))
    found = {node: claims.found({node: listed}) for node, listed in answered.items()}
    return found if stopped else running(found), failed


def of(cluster: Cluster, stopped: bool = False) -> Seen:
    """`on_nodes` for the cluster's nodes."""
    return on_nodes(cluster.nodes, stopped)


def running(seen: Seen) -> Seen:
    """`on_nodes` with `stopped`, without the clusters that run nothing on a node."""
    return {node: {k: c for k, c in on.items() if claims.live(c)} for node, on in seen.items()}


def volumes(cluster: Cluster) -> dict[str, set[str]]:
    """node -> the cluster's Compose volumes there (none where the node does not answer)."""
    label = f"com.docker.compose.project={cluster.name}"

    def listed(context: str) -> Callable[[], set[str]]:
        docker = DockerClient(context=context)
        return lambda: {v.name for v in docker.volume.list([("label", label)])}

    seen = each({n.name: listed(n.docker_context) for n in cluster.nodes}, TIMEOUT)
    return {n: set() if isinstance(v, BaseException) else v for n, v in seen.items()}


def _split(
    seen: dict[str, list[Container] | BaseException],
) -> tuple[dict[str, list[Container]], dict[str, str]]:
    """Each key's containers where its engine answered; why not where it did not."""
    answered = {k: v for k, v in seen.items() if not isinstance(v, BaseException)}
    failed = {k: reason(v) for k, v in seen.items() if isinstance(v, BaseException)}
    return answered, failed


def _look(context: str) -> Callable[[], list[Container]]:
    docker = DockerClient(context=context)
    return lambda: docker.container.list(all=True, filters=[("label", claims.CLUSTER)])
