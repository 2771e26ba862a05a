"""Looking at a running group: each node's services and their health, the merged logs, and what is
wrong with it (what `watch` acts on). Reads only; starts and writes nothing."""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterator
from functools import partial

from pydantic import BaseModel
from python_on_whales import DockerException
from python_on_whales.components.container.models import ContainerState

from generator.base import probes
from generator.base.containers import health_of
from generator.base.errors import VllmComposeError, reason
from generator.base.fanout import each, pump
from generator.config import Node
from generator.nodes import doorreplicas, engines, hardware
from generator.nodes.fleet import Fleet
from generator.nodes.hardware import Hardware
from generator.operations import readiness

STATE_TIMEOUT = 30  # per node: an engine that does not list its containers by then is down
GPU_TIMEOUT = 10  # per node: a node that vanished must not hold up a recovery


class ServiceRow(BaseModel):
    service: str | None
    state: str | None
    health: str | None


class StatusRow(BaseModel):
    """One node in `status --json`; `ray_alive_at_ip` only with the Ray backend, `error` only
    when the node's engine did not answer, `replica` only with replicas."""

    node: str
    ip: str
    services: list[ServiceRow] = []
    error: str | None = None
    ray_alive_at_ip: bool | None = None
    replica: int | None = None  # with replicas: which (1 on)


def status(fleet: Fleet) -> list[StatusRow]:
    ray = fleet.cluster.backend == "ray"
    alive = fleet.ray_nodes() if ray else {}
    rows = []
    for node in fleet.cluster.nodes:
        row = StatusRow(node=node.name, ip=str(node.ip), services=[])
        if fleet.cluster.replicas > 1:
            row.replica = fleet.cluster.replica + 1
        try:
            row.services = [
                ServiceRow(
                    service=name,
                    state=state.status,
                    health=health_of(state),
                )
                for name, state in fleet.states(node).items()
            ]
        except DockerException as e:
            row.error = reason(e)
        if ray:
            row.ray_alive_at_ip = str(node.ip) in alive if alive is not None else None
        rows.append(row)
    return rows


def logs(fleet: Fleet, node: str | None, follow: bool) -> Iterator[str]:
    """Lines of every node's services (or one node's), each prefixed by its node."""
    nodes = [n for n in fleet.cluster.nodes if node in (None, n.name)]
    merged: queue.Queue[str | None] = queue.Queue()
    for n in nodes:
        pump(_lines(fleet, n, follow), merged)
    ended = 0
    while ended < len(nodes):
        line = merged.get()
        if line is None:
            ended += 1
        else:
            yield line


def _lines(fleet: Fleet, node: Node, follow: bool) -> Iterator[str]:
    try:
        for chunk in engines.log_chunks(fleet, node, follow):
            for line in chunk.decode(errors="replace").splitlines():
                yield f"{node.name} | {line}"
    except DockerException as e:
        yield f"{node.name} | (logs unavailable: {reason(e)})"


def problems(fleet: Fleet, deadline: float) -> list[str]:
    """What is wrong with the running group, one line each; none when it serves: every service
    of every node running, every node alive in Ray at its IP, and a real completion back from
    serve within `deadline` seconds."""
    found, lost = _service_problems(fleet)
    if lost and len(found) == len(lost):  # nothing wrong but engines this machine cannot reach
        inside = _seen_inside(fleet, lost, deadline)
        if inside:
            names = ", ".join(n.name for n in lost)
            fleet.report(f"watch: no path from here to {names}'s engine, but {inside}; kept")
            return []
    if found:
        return found
    if fleet.cluster.backend == "ray":
        alive = fleet.ray_nodes()
        if alive is None:
            return [f"{fleet.head.name}: Ray's GCS does not answer"]
        found += [
            f"{n.name}: not alive in Ray at {n.ip}"
            for n in fleet.cluster.nodes
            if str(n.ip) not in alive
        ]
    return found + readiness.canary(fleet, deadline)


def _seen_inside(fleet: Fleet, lost: list[Node], deadline: float) -> str | None:
    """When this machine cannot reach some nodes' engines: whether the group itself still
    serves, as the nodes it can reach see it: every node alive in Ray (backend ray, asked of a
    reachable node's Ray container) and, when the head is reachable, a canary through it (a
    completion needs every rank). None when that does not vouch for it."""
    c, reachable = fleet.cluster, [n for n in fleet.cluster.nodes if n not in lost]
    seen = []
    if c.backend == "ray" and reachable:
        alive = fleet.ray_nodes(reachable[0]) or {}
        if not all(str(n.ip) in alive for n in c.nodes):
            return None
        seen.append(f"every node is alive in Ray as {reachable[0].name} sees it")
    if fleet.head not in lost:
        if readiness.canary(fleet, deadline):
            return None
        seen.append("the canary answered on the head")
    return " and ".join(seen) or None


def _service_problems(fleet: Fleet) -> tuple[list[str], list[Node]]:
    """One line per service not running, after one per node whose engine does not answer (it
    explains what is missing elsewhere); and those nodes."""

    def states(node: Node) -> Callable[[], dict[str, ContainerState]]:
        return lambda: fleet.states(node)

    seen = each({n.name: states(n) for n in fleet.cluster.nodes}, STATE_TIMEOUT)
    errors = {name: e for name, e in seen.items() if isinstance(e, BaseException)}
    found = [f"{name}: engine does not answer: {reason(e)}" for name, e in errors.items()]
    lost = [n for n in fleet.cluster.nodes if n.name in errors]
    for node in fleet.cluster.nodes:
        state = seen[node.name]
        if isinstance(state, BaseException):
            continue
        for service in fleet.stacks[node.name].services:
            if service.name not in state:
                found.append(f"{node.name}: {service.name} is not there")
            elif not state[service.name].running:
                s = state[service.name]
                found.append(f"{node.name}: {service.name} {s.status} (exit {s.exit_code})")
    return found, lost


def sidecars_down(fleet: Fleet) -> dict[str, list[str]]:
    """node -> its sidecars (the front door; with `metrics`, the exporters) that are not running
    and that Docker will not start again: stopped or killed through the engine, or removed (one
    that exited by itself it restarts). The group serves without them, so they are not among its
    problems; but its clients reach it through the door. A node whose engine does not answer is
    left out: its problems name it."""

    def down(node: Node) -> Callable[[], list[str]]:
        def run() -> list[str]:
            states = fleet.states(node)
            return [s.name for s in fleet.stacks[node.name].sidecars if not _up(states.get(s.name))]

        return run

    nodes = [n for n in fleet.cluster.nodes if fleet.stacks[n.name].sidecars]
    seen = each({n.name: down(n) for n in nodes}, STATE_TIMEOUT)
    return {node: names for node, names in seen.items() if isinstance(names, list) and names}


def _up(state: ContainerState | None) -> bool:
    """Running, or about to be again (its restart policy's back-off)."""
    return state is not None and bool(state.running or state.restarting)


def gpus(fleet: Fleet, node: Node) -> Hardware | None:
    """The node's GPUs and memory, as its first service's container sees them; None when it
    cannot say (not running, or its engine does not answer)."""
    service = fleet.stacks[node.name].services[0].name
    try:
        return Hardware.model_validate_json(fleet.execute(node, service, probes.gpus()))
    except (DockerException, ValueError):
        return None


def heat(fleet: Fleet) -> dict[str, hardware.Reading]:
    """node -> its GPUs' heat, for the nodes that answered in time; {} without GPUs."""
    c = fleet.cluster
    if c.accelerator != "nvidia":
        return {}
    seen = each({n.name: partial(gpus, fleet, n) for n in c.nodes}, GPU_TIMEOUT)
    return {
        name: hardware.reading(found, c.gpu_temperature_limit)
        for name, found in seen.items()
        if isinstance(found, Hardware)
    }


def shares(fleet: Fleet) -> list[str]:
    """With replicas: each as the front door sees it, and its share of the requests the door
    has sent since it started (a line each; one saying why when the door cannot be asked)."""
    try:
        seen = doorreplicas.shares(fleet)
    except (VllmComposeError, DockerException) as e:
        return [f"front door: its replicas not read: {reason(e)}"]
    total = sum(r.total for r, _ in seen)
    return [
        f"front door: {r.name}: {r.status}, {r.now} under way, {share:.0%} of {total} requests"
        " since it started"
        for r, share in seen
    ]
