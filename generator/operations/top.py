"""`top`: one row per node (its containers and their health, CPU and memory, GPUs where there are
any) and the endpoint's load (requests running and waiting, KV-cache use, prompt and generated
tokens per second, from vLLM's /metrics read twice). With replicas, each one's load and how the
front door sees it (its state, its share of the requests), and the endpoint's as their sum.
Reads only."""

from __future__ import annotations

from collections.abc import Callable

from pydantic import BaseModel
from python_on_whales import DockerException

from generator.base.containers import described, service_of
from generator.base.errors import VllmComposeError, reason
from generator.base.fanout import each
from generator.config import Node
from generator.nodes import doorreplicas, engines, hardware, served
from generator.nodes.fleet import Fleet
from generator.nodes.hardware import Hardware
from generator.operations import observe

TIMEOUT = 30  # per node


class NodeRow(BaseModel):
    node: str
    ip: str
    services: dict[str, str] = {}  # service -> "running, healthy"
    cpu_percent: float | None = None  # of one core, summed over the node's containers
    memory_bytes: int | None = None
    hardware: Hardware | None = None  # the GPUs (None fields where they say N/A), node memory
    error: str | None = None


class Endpoint(BaseModel):
    """vLLM's load as its /metrics says it; a rate needs two samples (None on the first)."""

    running: float
    waiting: float
    kv_cache_percent: float
    prompt_tokens_per_s: float | None = None
    generation_tokens_per_s: float | None = None


class Replica(BaseModel):
    """One replica: its load (None when its vLLM's /metrics did not answer) and the door's view."""

    replica: int  # 1 on
    endpoint: Endpoint | None
    door: str | None = None  # HAProxy's state of it: UP, DOWN, DRAIN, ...
    requests: int | None = None  # sent to it since the door started
    share_percent: float | None = None  # of the requests the door sent to a replica


class Top(BaseModel):
    nodes: list[NodeRow]
    endpoint: Endpoint | None  # None when vLLM's /metrics did not answer: endpoint_error says so
    endpoint_error: str | None = None
    replicas: list[Replica] = []  # with replicas; `endpoint` is then their sum


Before = list[dict[str, float]]  # each group's /metrics of the last sample, in order


def sample(
    fleet: Fleet, groups: list[Fleet], before: Before | None, seconds: float
) -> tuple[Top, Before]:
    """Every node's row and the endpoint's load, from each of `groups` (the replicas; the one
    group); the rates over `seconds` since `before` (the /metrics returned last time).
    -> (what to show, the /metrics to pass next time)."""
    found = each({n.name: _row(fleet, n) for n in fleet.cluster.nodes}, TIMEOUT)
    rows = [
        r if isinstance(r, NodeRow) else NodeRow(node=n, ip="", error=reason(r))
        for n, r in found.items()
    ]
    loads = list(each({str(i): _load(g) for i, g in enumerate(groups)}, TIMEOUT).values())
    now = [load if isinstance(load, dict) else {} for load in loads]
    prior = before or [{} for _ in groups]
    endpoints = [_endpoint_of(load, last, seconds) for load, last in zip(now, prior, strict=True)]
    if len(groups) == 1:
        said = None if endpoints[0] else "vLLM's /metrics did not answer"
        return Top(nodes=rows, endpoint=endpoints[0], endpoint_error=said), now
    replicas = [Replica(replica=i + 1, endpoint=e) for i, e in enumerate(endpoints)]
    _door(fleet, replicas)
    answered = [e for e in endpoints if e]
    whole = _summed(answered, before is not None) if answered else None
    missing = len(groups) - len(answered)
    said = f"{missing} of {len(groups)} replicas' /metrics did not answer" if missing else None
    return Top(nodes=rows, endpoint=whole, endpoint_error=said, replicas=replicas), now


def _load(fleet: Fleet) -> Callable[[], dict[str, float]]:
    def run() -> dict[str, float]:
        return served.load(fleet) or {}

    return run


def _endpoint_of(load: dict[str, float], before: dict[str, float], seconds: float) -> (
        Endpoint | None):  # fmt: skip
    """One group's load from its /metrics (None: it did not answer); rates where it did before."""
    if not load:
        return None
    kv_cache = round(100 * load.get("kv_cache", 0.0), 1)
    endpoint = Endpoint(running=load["running"], waiting=load["waiting"], kv_cache_percent=kv_cache)
    if before:
        endpoint.prompt_tokens_per_s = _rate(load, before, "prompt_tokens", seconds)
        endpoint.generation_tokens_per_s = _rate(load, before, "tokens", seconds)
    return endpoint


def _summed(endpoints: list[Endpoint], rates: bool) -> Endpoint:
    """The replicas' loads as one endpoint's: requests and tokens summed, the KV cache's mean."""
    kv_cache = round(sum(e.kv_cache_percent for e in endpoints) / len(endpoints), 1)
    whole = Endpoint(
        running=sum(e.running for e in endpoints),
        waiting=sum(e.waiting for e in endpoints),
        kv_cache_percent=kv_cache,
    )
    if rates and all(e.generation_tokens_per_s is not None for e in endpoints):
        whole.prompt_tokens_per_s = round(sum(e.prompt_tokens_per_s or 0 for e in endpoints), 1)
        whole.generation_tokens_per_s = round(
            sum(e.generation_tokens_per_s or 0 for e in endpoints), 1
        )
    return whole


def _door(fleet: Fleet, replicas: list[Replica]) -> None:
    """Each replica's state at the door and its share of the requests, where the door answers."""
    try:
        seen = doorreplicas.shares(fleet)
    except (VllmComposeError, DockerException):
        return
    for replica, (door, share) in zip(replicas, seen, strict=False):
        replica.door, replica.requests = door.status, door.total
        replica.share_percent = round(100 * share, 1)


def _rate(now: dict[str, float], before: dict[str, float], key: str, seconds: float) -> float:
    return round(max(0.0, now.get(key, 0.0) - before.get(key, 0.0)) / seconds, 1)


def _row(fleet: Fleet, node: Node) -> Callable[[], NodeRow]:
    def run() -> NodeRow:
        row = NodeRow(node=node.name, ip=str(node.ip))
        containers = fleet.containers(node)
        for c in containers:
            row.services[service_of(c)] = described(c.state)
        running = [c for c in containers if c.state.running]
        if running:
            stats = engines.stats(fleet, node, running)
            row.cpu_percent = round(sum(s.cpu_percentage or 0.0 for s in stats), 1)
            row.memory_bytes = sum(s.memory_used or 0 for s in stats)
        if fleet.cluster.accelerator == "nvidia" and running:
            row.hardware = observe.gpus(fleet, node)
        return row

    return run


WIDTH = 80  # a terminal's columns: every line of the view fits


def lines(top: Top) -> list[str]:
    """The view as text: a header, a line per node (its IP, CPU, memory), one per GPU and one per
    service under it, a line per replica, and the endpoint's load last; each line at most WIDTH
    columns."""
    said = [_line("NODE / SERVICE", "STATE", "CPU", "MEMORY")]
    for r in top.nodes:
        cpu = "-" if r.cpu_percent is None else f"{r.cpu_percent:.0f}%"
        memory = "-" if r.memory_bytes is None else f"{r.memory_bytes / 2**30:.1f} GiB"
        said.append(_line(r.node, r.error or r.ip, cpu, memory))
        gpus = hardware.describe(r.hardware).split("; ") if r.hardware else []
        said += [_line(f"  gpu {i}", gpu, "", "") for i, gpu in enumerate(gpus)]
        said += [_line(f"  {service}", state, "", "") for service, state in r.services.items()]
    said += [_replica(replica) for replica in top.replicas]
    return [*said, _endpoint(top)]


def _line(name: str, state: str, cpu: str, memory: str) -> str:
    return _fit(f"{name:<20} {state:<36} {cpu:>8} {memory:>12}".rstrip())


def _replica(r: Replica) -> str:
    """A replica's line, shorter than the endpoint's: its door state and share, then its load."""
    door = "door: -" if r.door is None else f"{r.door}, {r.share_percent:g}% of requests"
    e = r.endpoint
    if e is None:
        return _fit(f"replica {r.replica}: {door}; /metrics did not answer")
    rates = "-" if e.generation_tokens_per_s is None else (
        f"{e.prompt_tokens_per_s:.1f}/{e.generation_tokens_per_s:.1f}")  # fmt: skip
    load = f"{e.running:g} running, {e.waiting:g} waiting; KV {e.kv_cache_percent:g}%"
    return _fit(f"replica {r.replica}: {door}; {load}; tok/s {rates}")


def _fit(text: str) -> str:
    return text if len(text) <= WIDTH else text[: WIDTH - 1] + "…"


def _endpoint(top: Top) -> str:
    e = top.endpoint
    if e is None:
        return _fit(f"endpoint: {top.endpoint_error or 'no figures'}")
    return _fit(f"endpoint: {_load_text(e)}")


def _load_text(e: Endpoint) -> str:
    rates = "tokens/s in/out: -" if e.generation_tokens_per_s is None else (
        f"tokens/s in/out: {e.prompt_tokens_per_s:.1f}/{e.generation_tokens_per_s:.1f}"
    )  # fmt: skip
    load = f"{e.running:g} running, {e.waiting:g} waiting"
    return f"{load}; KV cache {e.kv_cache_percent:g}%; {rates}"
