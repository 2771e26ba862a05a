"""What a cluster claims on each of its nodes (its ports, its share of GPU memory, Ray's object
store), written as labels on every container of its stacks; read back from the containers found
on a node, so that preflight names a clash with another cluster before anything starts, and `ls`
lists every cluster on the nodes."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from generator.base.containers import described
from generator.base.errors import DockerError
from generator.config import ports

if TYPE_CHECKING:
    from python_on_whales import Container

    from generator.config import Cluster

PREFIX = "io.vllm-compose."
CLUSTER = f"{PREFIX}cluster"
ENDPOINT = f"{PREFIX}endpoint"
MODEL = f"{PREFIX}model"  # the served model name, which the front door routes by
CONFIG = f"{PREFIX}config"  # the name of the config file the stack was rendered from
REPLICA = f"{PREFIX}replica"  # with replicas, the node's (1 on)


def gpu_memory(c: Cluster) -> float:
    return c.vllm.gpu_memory_utilization or c.settings.gpu_memory_utilization


def object_store(c: Cluster) -> int:
    if c.backend != "ray":
        return 0
    return c.ray.object_store_memory or c.settings.object_store_memory or 0


def labels(c: Cluster) -> dict[str, str]:
    """The claims of the cluster's stack on each of its nodes."""
    spans = {name: [r.start, r.stop] for name, r in ports.ranges(c).items()}
    replica = {REPLICA: str(c.replica + 1)} if c.replicas > 1 else {}
    return {
        f"{PREFIX}backend": c.backend,
        ENDPOINT: f"http://{c.replica_heads[0].ip}:{c.vllm.port}/v1",  # with replicas, the door's
        MODEL: c.served_model_name,
        f"{PREFIX}ports": json.dumps(spans, separators=(",", ":")),
        f"{PREFIX}gpu-memory": str(gpu_memory(c)),
        f"{PREFIX}object-store": str(object_store(c)),
        **replica,
    }


@dataclass
class Claim:
    """One cluster as its containers on the nodes show it."""

    cluster: str
    backend: str = "?"
    endpoint: str = "?"
    ports: dict[str, range] = field(default_factory=dict)
    gpu_memory: float = 0.0
    object_store: int = 0
    config: str = "?"
    model: str = ""  # its served model name
    # node -> service -> "running", "running, unhealthy", "exited (exit 137)", ...
    nodes: dict[str, dict[str, str]] = field(default_factory=dict)
    replicas: dict[str, int] = field(default_factory=dict)  # node -> its replica, with replicas

    @property
    def health(self) -> str:
        bad = [
            f"{node}: {service} {state}"
            for node, services in self.nodes.items()
            for service, state in services.items()
            if state not in ("running", "running, healthy")
        ]
        return "; ".join(bad) if bad else "running"

    @property
    def route(self) -> tuple[str, int] | None:
        """Its served model and the loopback port its vLLM listens on behind the front door;
        None for a cluster without one (or labels of an older version)."""
        behind = self.ports.get(ports.BEHIND_DOOR_NAME)
        return (self.model, behind.start) if self.model and behind else None

    @property
    def door(self) -> tuple[str, int]:
        """Its endpoint's host and port: its front door's, where it has one."""
        parsed = urlsplit(self.endpoint)
        return parsed.hostname or "", parsed.port or 0

    @property
    def front_door(self) -> bool:
        """Is its endpoint a front door (one of its nodes runs one)?"""
        return any("front-door" in services for services in self.nodes.values())


def found(containers: dict[str, list[Container]]) -> dict[str, Claim]:
    """node -> its containers (every cluster's), as cluster -> Claim."""
    claims: dict[str, Claim] = {}
    for node, listed in containers.items():
        for container in listed:
            own = container.config.labels or {}
            if CLUSTER not in own or own.get(f"{PREFIX}role") == "sync":
                continue
            claim = claims.setdefault(own[CLUSTER], Claim(own[CLUSTER]))
            _read(claim, own)
            service = own.get(f"{PREFIX}service", container.name)
            name = own.get(f"{PREFIX}node", node)
            claim.nodes.setdefault(name, {})[service] = described(container.state)
            if own.get(REPLICA, "").isdigit():
                claim.replicas[name] = int(own[REPLICA])
    return claims


def _read(claim: Claim, own: dict[str, str]) -> None:
    claim.backend = own.get(f"{PREFIX}backend", claim.backend)
    claim.endpoint = own.get(ENDPOINT, claim.endpoint)
    claim.config = own.get(CONFIG, claim.config)
    claim.model = own.get(MODEL, claim.model)
    try:
        spans = json.loads(own.get(f"{PREFIX}ports", "{}"))
        claim.ports = {name: range(start, stop) for name, (start, stop) in spans.items()}
        claim.gpu_memory = float(own.get(f"{PREFIX}gpu-memory", "0"))
        claim.object_store = int(own.get(f"{PREFIX}object-store", "0"))
    except (ValueError, TypeError):
        pass  # written by another version: listed, not compared


def foreign(claim: Claim, name: str, config: str) -> bool:
    """Is the claim another cluster than the one of this name and config file? One of another
    name is; one of ours from another config file is too (a copy that kept the name would
    replace it), unless either file is unknown."""
    return claim.cluster != name or (config not in ("", "?") and claim.config not in ("?", config))


def split(
    seen: dict[str, dict[str, Claim]], name: str, config: str
) -> tuple[dict[str, list[Claim]], set[str]]:
    """node -> cluster -> claim as node -> the other clusters there (`foreign`), and the nodes
    where the cluster of this name and config has containers."""
    others = {
        node: [c for c in on.values() if foreign(c, name, config)] for node, on in seen.items()
    }
    return others, {node for node, on in seen.items() if len(others[node]) < len(on)}


def live(claim: Claim) -> bool:
    """Does the claim, as one engine's containers show it, run anything there (a stopped stack
    holds no port or memory)? Its node names are its own config's, not ours."""
    return any(s.startswith("running") for on in claim.nodes.values() for s in on.values())


def clashes(c: Cluster, node: str, others: list[Claim], shm_bytes: int | None) -> list[str]:
    """What the cluster would clash on with the other clusters running on the node."""
    others = sorted(others, key=lambda o: o.cluster)
    found = [f"{name_taken(o)}: a start would replace it" for o in others if o.cluster == c.name]
    others = [o for o in others if o.cluster != c.name]
    found += port_clashes(c, others)
    if c.front_door.enabled:  # `others` as this node's engine sees them: their doors here
        found += [
            f"model {o.model!r} is served by cluster '{o.cluster}' behind its front door here"
            ", and the doors on these nodes route by it: set vllm.served_model_name"
            for o in others
            if o.front_door and o.model == c.served_model_name
        ]
    total = gpu_memory(c) + sum(o.gpu_memory for o in others)
    if others and total > 1.0 + 1e-9:
        shares = " + ".join(f"{o.gpu_memory:g} of '{o.cluster}'" for o in others)
        found.append(
            f"GPU memory overflows: {gpu_memory(c):g} of '{c.name}' + {shares} = {total:.2f} > 1"
        )
    stores = object_store(c) + sum(o.object_store for o in others)
    if others and shm_bytes is not None and object_store(c) and stores > shm_bytes:
        found.append(
            f"Ray's object stores ({stores >> 20} MiB with the other clusters') exceed /dev/shm "
            f"({shm_bytes >> 20} MiB)"
        )
    return found


def apart(c: Cluster, others: dict[str, list[Claim]]) -> dict[str, list[str]]:
    """node -> what to say there of the other clusters on the nodes behind a front door that is
    on none of them: this cluster's `up` cannot reach that door, so neither routes to the other's
    model (the doors on the cluster's nodes route to each other). Each is said once, on the first
    node it is seen on. `others`: node -> the other clusters running there, as that node's
    engine shows them."""
    if not c.front_door.enabled:
        return {}
    doors = {o.cluster for on in others.values() for o in on if o.front_door}
    at: dict[str, str] = {}
    for node in (n.name for n in c.nodes):
        for o in others.get(node, []):
            if o.route and o.cluster not in doors:
                at.setdefault(o.cluster, node)
    said: dict[str, list[str]] = {}
    for cluster, node in at.items():
        said.setdefault(node, []).append(
            f"'{cluster}' has its front door on a node this cluster is not on: neither routes to"
            " the other's model (add that node to this cluster's, or run its door here)"
        )
    return said


def name_taken(other: Claim) -> str:
    """Another config's cluster under this config's name (`foreign` says which are)."""
    return f"the name '{other.cluster}' is taken by the cluster started from {other.config}"


def refuse_same_name(name: str, config: str, others: dict[str, list[Claim]]) -> None:
    """A cluster of this name started from another config file is on a node (`others`: node ->
    the other clusters there, running or stopped): its stacks are not this config's to replace
    or remove (`foreign`)."""
    for node, on in others.items():
        for claim in on:
            if claim.cluster == name:
                hint = f"give this config another name, or act on that one: {claim.config}"
                raise DockerError(node, f"{name_taken(claim)}, not {config}", hint=hint)


def port_clashes(c: Cluster, others: list[Claim]) -> list[str]:
    """Each port of the cluster that another cluster's ports span, naming it."""
    found = []
    mine = ports.ranges(c)
    for other in others:
        for name, span in mine.items():
            for theirs, taken in other.ports.items():
                if ports.overlap(span, taken):
                    where = f"{span.start}" if len(span) == 1 else f"{span.start}-{span[-1]}"
                    found.append(f"{name} {where} is taken by cluster '{other.cluster}' ({theirs})")
    return found
