"""A node's GPUs and memory as its container reported them (image/gpus.py: nvidia-smi's fields, with
`[N/A]` as None, and /proc/meminfo), and what preflight, `top` and `watch` make of them: a GPU
throttled for heat or over the configured limit, and, on a unified-memory GPU (DGX Spark's GB10),
whether the node's free memory holds what vLLM and Ray's object store will take."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel

from generator.base.verdict import Check, failed, passed, skipped
from generator.config import Cluster, Node
from generator.stack import claims

GIB = 2**30
HEAT = ("sw_thermal_slowdown", "hw_thermal_slowdown")  # NVML's clock event reasons for heat
RAY_STORE_SHARE = 0.3  # Ray's object store takes this share of available memory when unset
NEAR = 5  # °C under the limit that still counts as hot for a node that vanished


class Gpu(BaseModel):
    """One GPU; every field None where nvidia-smi answered `[N/A]` or does not know it."""

    index: int | None = None
    name: str | None = None
    memory_total_mib: float | None = None
    memory_used_mib: float | None = None
    memory_free_mib: float | None = None
    utilization_percent: float | None = None
    temperature_c: float | None = None
    to_slowdown_c: float | None = None  # degrees left before the GPU slows itself down
    power_w: float | None = None
    power_limit_w: float | None = None
    throttle: list[str] | None = None  # active clock event reasons, by name
    addressing: str | None = None
    unified: bool = False  # no memory of its own: it takes the node's


class Hardware(BaseModel):
    """What `vllm-compose-health gpus` prints (and facts carry)."""

    devices: list[Gpu] | None = None  # None: no nvidia-smi, or it failed (gpu_error says)
    gpu_error: str | None = None
    memory: dict[str, int] | None = None  # /proc/meminfo's figures in bytes


def unified(devices: list[Gpu] | None) -> bool:
    return bool(devices) and all(g.unified for g in devices or [])


def too_hot(devices: list[Gpu] | None, limit: float) -> str | None:
    """Why the node's GPUs should not run now (throttled for heat, or at or over `limit` °C)."""
    for g in devices or []:
        heat = [r for r in g.throttle or [] if r in HEAT]
        where = f"GPU {g.index} at {_temperature(g)}"
        if heat:
            return f"{where} is throttled for heat ({', '.join(heat)})"
        if g.temperature_c is not None and g.temperature_c >= limit:
            return f"{where}, at or over the {limit:g} °C limit"
    return None


def hottest(devices: list[Gpu] | None) -> float | None:
    found = [g.temperature_c for g in devices or [] if g.temperature_c is not None]
    return max(found) if found else None


@dataclass(frozen=True)
class Reading:
    """What `watch` keeps of a node's GPUs from one look to the next."""

    hottest: float | None
    too_hot: str | None  # why a restart on this node should wait, or None
    near: bool  # throttled for heat or within NEAR °C of the limit: heat explains a vanished node


def reading(found: Hardware, limit: float) -> Reading:
    warmest, why = hottest(found.devices), too_hot(found.devices, limit)
    near = why is not None or (warmest is not None and warmest >= limit - NEAR)
    return Reading(warmest, why, near)


def checks(
    c: Cluster, node: Node, rdma: dict[str, str], count: int | None, found: Hardware, serving: bool
) -> list[Check]:
    """Preflight's hardware checks of one node: RDMA ports, GPUs, heat, unified memory."""
    if c.accelerator != "nvidia":
        why = "accelerator none: no GPUs or RDMA expected"
        return [skipped("rdma", node.name, why), skipped("gpus", node.name, why)]
    found_gpus = _gpus(node, count, found)
    if not found.devices:
        return [_rdma(c, node, rdma), found_gpus]
    return [_rdma(c, node, rdma), found_gpus, heat(c, node, found), memory(c, node, found, serving)]


def _rdma(c: Cluster, node: Node, rdma: dict[str, str]) -> Check:
    if not rdma and c.settings.devices:
        cause = f"profile {c.profile} needs RDMA and the node has no RDMA device"
        hint = "ibdev2netdev on the node (the ConnectX driver), or profile: generic for TCP"
        return failed("rdma", node.name, cause, hint)
    if not rdma:
        return skipped("rdma", node.name, "no RDMA devices: NCCL uses TCP sockets")
    down = sorted(p for p, state in rdma.items() if state != "ACTIVE")
    if down:
        cause = f"RDMA ports not active: {', '.join(down)}"
        return failed("rdma", node.name, cause, "check the cable and ibdev2netdev")
    return passed("rdma", node.name, f"{len(rdma)} RDMA ports active")


def _gpus(node: Node, count: int | None, found: Hardware) -> Check:
    if count is None:
        cause = f"no GPU in the container: {found.gpu_error or 'no nvidia-smi'}"
        return failed("gpus", node.name, cause, "the NVIDIA container runtime")
    if count < node.gpus:
        cause = f"{count} GPUs visible, {node.gpus} configured"
        return failed("gpus", node.name, cause, "nvidia-smi on the node")
    names = sorted({g.name or "?" for g in found.devices or []})
    kind = f" ({', '.join(names)}{', unified memory' if unified(found.devices) else ''})"
    return passed("gpus", node.name, f"{count} GPUs visible{kind if names else ''}")


def heat(c: Cluster, node: Node, found: Hardware) -> Check:
    if not found.devices:
        return skipped("heat", node.name, "no GPU reported a temperature")
    why = too_hot(found.devices, c.gpu_temperature_limit)
    if why:
        hint = "let it cool, check its airflow; cap its clocks with nvidia-smi -lgc if it recurs"
        return failed("heat", node.name, why, hint)
    shown = ", ".join(f"GPU {g.index} {_temperature(g)}, {_power(g)}" for g in found.devices)
    return passed("heat", node.name, f"{shown} (limit {c.gpu_temperature_limit:g} °C)")


def needed(c: Cluster, memory: dict[str, int]) -> tuple[int, int]:
    """(what vLLM will take, what Ray's object store will take) of a unified-memory node, in
    bytes: vLLM sizes gpu_memory_utilization against the whole shared pool."""
    vllm = int(claims.gpu_memory(c) * memory.get("MemTotal", 0))
    store = claims.object_store(c)
    if c.backend == "ray" and not store:
        store = int(RAY_STORE_SHARE * memory.get("MemAvailable", 0))
    return vllm, store


def memory(c: Cluster, node: Node, found: Hardware, serving: bool) -> Check:
    """On a unified-memory GPU: the node's free memory holds what vLLM and the object store will
    take. CUDA's free memory there does not count the page cache, so a start can fail, after
    the model began loading, on a node whose memory is only cached."""
    memory = found.memory or {}
    if not unified(found.devices):
        return skipped("memory", node.name, "the GPUs have memory of their own")
    if serving:
        return skipped("memory", node.name, "unified; this stack already serves from it")
    if "MemFree" not in memory or "MemAvailable" not in memory:
        return skipped("memory", node.name, "unified, but /proc/meminfo gave no figures")
    vllm, store = needed(c, memory)
    free, available = memory["MemFree"], memory["MemAvailable"]
    wants = f"vLLM ({claims.gpu_memory(c):g} of {_gib(memory.get('MemTotal', 0))})"
    wants += f" and Ray's object store ({_gib(store)})" if store else ""
    if vllm + store <= free:
        return passed("memory", node.name, f"unified: {_gib(free)} free; {wants} take "
                      f"{_gib(vllm + store)}")  # fmt: skip
    short = f"unified memory: {wants} need {_gib(vllm + store)}, {_gib(free)} is free"
    if vllm + store <= available:
        cause = f"{short}; the page cache holds {_gib(available - free)} of the rest"
        hint = "vllm-compose preflight --drop-caches CONFIG drops it on every node"
        return failed("memory", node.name, cause, hint)
    cause = f"{short}, {_gib(available)} with the page cache dropped"
    hint = "lower vllm.gpu_memory_utilization, or stop what holds the memory on the node"
    return failed("memory", node.name, cause, hint)


def describe(found: Hardware) -> str:
    """One GPU a phrase, for `top`: temperature, power, use, memory (the node's when unified),
    and any clock reason other than idle."""
    phrases = []
    memory = found.memory or {}
    for g in found.devices or []:
        if g.unified and "MemTotal" in memory:
            used = memory["MemTotal"] - memory.get("MemAvailable", 0)
            held = f"{used / GIB:.0f}/{memory['MemTotal'] / GIB:.0f} GiB unified"
        elif g.memory_total_mib is not None and g.memory_used_mib is not None:
            held = f"{g.memory_used_mib / 1024:.0f}/{g.memory_total_mib / 1024:.0f} GiB"
        else:
            held = "memory n/a"
        use = "n/a" if g.utilization_percent is None else f"{g.utilization_percent:g}%"
        reasons = [r for r in g.throttle or [] if r != "idle"]
        said = f" [{', '.join(reasons)}]" if reasons else ""
        phrases.append(f"{_temperature(g)} {_power(g)} {use} {held}{said}")
    return "; ".join(phrases) or (found.gpu_error or "-")


def _temperature(g: Gpu) -> str:
    return "? °C" if g.temperature_c is None else f"{g.temperature_c:g} °C"


def _power(g: Gpu) -> str:
    return "? W" if g.power_w is None else f"{g.power_w:.0f} W"


def _gib(size: float, digits: int = 1) -> str:
    return f"{size / GIB:.{digits}f} GiB"
