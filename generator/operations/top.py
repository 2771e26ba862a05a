"""`top`: one row per node (its containers and their health, CPU and memory, GPUs where there are
any) and the endpoint's load (requests running and waiting, KV-cache use, prompt and generated
tokens per second, from vLLM's /metrics read twice). Reads only."""

from __future__ import annotations

from collections.abc import Callable

from pydantic import BaseModel

from generator.base.containers import described, service_of
from generator.base.errors import reason
from generator.base.fanout import each
from generator.config import Node
from generator.nodes import engines, hardware, served
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


class Top(BaseModel):
    nodes: list[NodeRow]
    endpoint: Endpoint | None  # None when vLLM's /metrics did not answer: endpoint_error says so
    endpoint_error: str | None = None


def sample(
    fleet: Fleet, before: dict[str, float] | None, seconds: float
) -> tuple[Top, dict[str, float]]:
    """Every node's row and the endpoint's load; the rates over `seconds` since `before` (the
    /metrics returned last time). -> (what to show, the /metrics to pass next time)."""
    found = each({n.name: _row(fleet, n) for n in fleet.cluster.nodes}, TIMEOUT)
    rows = [
        r if isinstance(r, NodeRow) else NodeRow(node=n, ip="", error=reason(r))
        for n, r in found.items()
    ]
    load = served.load(fleet)
    if load is None:
        return Top(nodes=rows, endpoint=None, endpoint_error="vLLM's /metrics did not answer"), {}
    kv_cache = round(100 * load.get("kv_cache", 0.0), 1)
    endpoint = Endpoint(running=load["running"], waiting=load["waiting"], kv_cache_percent=kv_cache)
    if before:
        endpoint.prompt_tokens_per_s = _rate(load, before, "prompt_tokens", seconds)
        endpoint.generation_tokens_per_s = _rate(load, before, "tokens", seconds)
    return Top(nodes=rows, endpoint=endpoint), load


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
    service under it, and the endpoint's load last; each line at most WIDTH columns."""
    said = [_line("NODE / SERVICE", "STATE", "CPU", "MEMORY")]
    for r in top.nodes:
        cpu = "-" if r.cpu_percent is None else f"{r.cpu_percent:.0f}%"
        memory = "-" if r.memory_bytes is None else f"{r.memory_bytes / 2**30:.1f} GiB"
        said.append(_line(r.node, r.error or r.ip, cpu, memory))
        gpus = hardware.describe(r.hardware).split("; ") if r.hardware else []
        said += [_line(f"  gpu {i}", gpu, "", "") for i, gpu in enumerate(gpus)]
        said += [_line(f"  {service}", state, "", "") for service, state in r.services.items()]
    return [*said, _endpoint(top)]


def _line(name: str, state: str, cpu: str, memory: str) -> str:
    text = f"{name:<20} {state:<36} {cpu:>8} {memory:>12}".rstrip()
    return text if len(text) <= WIDTH else text[: WIDTH - 1] + "…"


def _endpoint(top: Top) -> str:
    e = top.endpoint
    if e is None:
        return f"endpoint: {top.endpoint_error or 'no figures'}"[:WIDTH]
    rates = "tokens/s in/out: -" if e.generation_tokens_per_s is None else (
        f"tokens/s in/out: {e.prompt_tokens_per_s:.1f}/{e.generation_tokens_per_s:.1f}"
    )  # fmt: skip
    load = f"{e.running:g} running, {e.waiting:g} waiting"
    return f"endpoint: {load}; KV cache {e.kv_cache_percent:g}%; {rates}"[:WIDTH]
