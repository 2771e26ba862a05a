"""Preflight's checks: pure functions of the config and the facts every node reported (`Facts`,
printed as JSON by `vllm-compose-health facts` inside a container of the node's stack). The numbers
in the hints refer to the rows of the failure table the project keeps."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from pydantic import BaseModel

from generator.base.manifest import differences
from generator.base.verdict import Check, failed, passed, skipped
from generator.config import MEMORY_MONITOR, Cluster, Node
from generator.nodes import hardware
from generator.nodes.hardware import Gpu, Hardware
from generator.operations import stamps
from generator.operations.stamps import Recorded
from generator.stack.claims import Claim, apart, clashes

SHM_MIN = 1 << 30  # below this, NCCL and vLLM's shared-memory transfers fail
TOKEN_AUTH_SINCE = (2, 52)  # the first Ray with RAY_AUTH_MODE=token


class Interface(BaseModel):
    exists: bool
    up: bool
    addresses: list[str]


class Reach(BaseModel):
    to: dict[str, str] = {}  # peer IP -> "ok" or the error
    heard_from: list[str] = []
    listen: str | None = None  # set when the node could not listen at all
    busy: bool = False  # ... because something else holds the port


class Facts(BaseModel):
    """What one node's container reported (image/health.py, `facts`)."""

    interface: Interface
    reach: Reach
    versions: dict[str, str | None]
    ray_on_path: bool
    ray_client: bool | None = None  # None: a wrapper older than the field
    model: dict[str, int] | None  # relative path -> size; -1 for a dangling symlink
    unreachable_links: dict[str, str] = {}  # relative path -> the target the container cannot see
    model_mtimes: dict[str, int] = {}  # relative path -> mtime (ns)
    shm_bytes: int
    memlock: int  # -1: unlimited
    memory_monitor: str | None
    api_port_free: bool | None
    rdma: dict[str, str]
    gpus: int | None
    devices: list[Gpu] | None = None  # image/gpus.py: temperature, power, clock reasons, memory
    gpu_error: str | None = None
    memory: dict[str, int] | None = None  # the node's /proc/meminfo, in bytes

    @property
    def hardware(self) -> Hardware:
        return Hardware(devices=self.devices, gpu_error=self.gpu_error, memory=self.memory)


@dataclass(frozen=True)
class Running:
    """What of this stack already runs on the head."""

    serve: bool = False
    door: bool = False  # the front door


def evaluate(
    cluster: Cluster,
    facts: dict[str, Facts],
    bases: dict[str, str | None],
    running: Running = Running(),
    stamped: stamps.Stamps | None = None,
    others: dict[str, list[Claim]] | None = None,
) -> list[Check]:
    """Every check for the nodes that answered. `bases`: node -> its base image ID (None when
    the node holds only the wrapper, streamed to it). `running`: what of this stack already runs
    on the head (its serve or its front door holds the API port). `stamped`: what verify recorded.
    `others`: node -> the other clusters running on it."""
    nodes = [n for n in cluster.nodes if n.name in facts]
    checks = [_config(cluster), _images(cluster, bases)]
    # Check by check, not node by node: a cause (an interface down) is listed before what it
    # causes (peers that cannot reach that node).
    checks += [_interface(cluster, n, facts[n.name]) for n in nodes]
    checks += [c for n in nodes for c in _reach(cluster, n, facts[n.name], nodes)]
    checks += [_ray(cluster, n, facts[n.name]) for n in nodes]
    checks.append(_versions(nodes, facts))
    head = facts.get(cluster.head.name)
    recorded = stamped.nodes if stamped else {}
    checks += [_model(cluster, n, facts[n.name], head, recorded.get(n.name)) for n in nodes]
    checks += [_shm(n, facts[n.name]) for n in nodes]
    others = others or {}
    away = apart(cluster, others)  # node -> notes
    checks += [
        _neighbours(cluster, n, others.get(n.name, []), facts[n.name], away.get(n.name, []))
        for n in nodes
    ]
    checks += [_memlock(cluster, n, facts[n.name]) for n in nodes]
    checks += [_memory_monitor(cluster, n, facts[n.name]) for n in nodes]
    checks += [c for n in nodes for c in _hardware(cluster, n, facts[n.name], running.serve)]
    if head is not None:
        checks.append(_api_port(cluster, head, running))
    return checks


def _config(c: Cluster) -> Check:
    # Invalid parallelism and duplicate names or IPs never get here: the config loader names them.
    what = f"TP {c.tensor_parallel_size} x PP {c.vllm.pipeline_parallel_size} fits {c.gpu_total}"
    return passed("config", "all", f"{what} GPUs; node names, IPs and contexts unique")


def _images(c: Cluster, bases: dict[str, str | None]) -> Check:
    known = {node: image for node, image in bases.items() if image}
    if len(set(known.values())) > 1:
        first = next(iter(known))
        odd = [n for n, image in known.items() if image != known[first]]
        cause = f"{c.image} is a different image on {', '.join(odd)} than on {first}: " + ", ".join(
            f"{n} {image[7:19] if image.startswith('sha256:') else image[:12]}"
            for n, image in known.items()
        )
        return failed("image", "all", cause, "pin the image by digest and distribute one image")
    return passed("image", "all", f"{c.image} is the same image on every node")


def _interface(c: Cluster, node: Node, f: Facts) -> Check:
    name, nic = c.interface_of(node), f.interface
    if not nic.exists:
        return failed("interface", node.name, f"{name} does not exist", "set the node's interface")
    if not nic.up:
        return failed("interface", node.name, f"{name} is down", f"ip link set {name} up")
    if str(node.ip) not in nic.addresses:
        carries = ", ".join(nic.addresses) or "no IPv4 address"
        cause = f"{name} carries {carries}, not {node.ip}"
        return failed("interface", node.name, cause, "fix the node's ip or interface")
    return passed("interface", node.name, f"{name} is up with {node.ip}")


def _reach(c: Cluster, node: Node, f: Facts, nodes: list[Node]) -> list[Check]:
    result = f.reach
    if result.listen:
        return [failed("reach", node.name, result.listen, "run preflight again")]
    checks = []
    for peer in nodes:
        if peer == node:
            continue
        outcome = result.to.get(str(peer.ip), "not tried")
        if outcome == "ok":
            checks.append(passed("reach", node.name, f"reaches {peer.name} at {peer.ip} over TCP"))
        else:
            cause = f"cannot reach {peer.name} at {peer.ip} over TCP: {outcome}"
            hint = "a firewall, cable, route or MTU between the two on the private link"
            checks.append(failed("reach", node.name, cause, hint))
    return checks


def _ray(c: Cluster, node: Node, f: Facts) -> Check:
    if c.backend != "ray":
        return skipped("ray", node.name, "backend native needs no Ray")
    if not f.ray_on_path:
        cause = f"{c.image} has no 'ray' on PATH"
        return failed("ray", node.name, cause, "use an image with Ray, or set 'backend: native'")
    found = f.versions.get("ray")
    if node == c.head and f.ray_client is False:
        cause = f"{c.image} has the minimal Ray: the head's `ray start` needs Ray's client extra"
        return failed("ray", node.name, cause, "an image with ray[client] (or ray[default])")
    if c.ray.token_auth and _release(found) < TOKEN_AUTH_SINCE:
        cause = f"ray {found} has no token authentication (2.52+): its ports would be open"
        hint = "an image with Ray 2.52 or later, or ray.token_auth: false on a closed network"
        return failed("ray", node.name, cause, hint)
    return passed("ray", node.name, f"ray {found} in the image")


def _release(version: str | None) -> tuple[int, int]:
    """(major, minor) of a version string; (0, 0) when there is none to read."""
    parts = (version or "").split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return 0, 0


def _model(c: Cluster, node: Node, f: Facts, head: Facts | None, was: Recorded | None) -> Check:
    path, files = c.model.path, f.model
    if files is None:
        return failed("model", node.name, f"{path} is missing", "copy the model to every node")
    if not files:
        return failed("model", node.name, f"{path} is empty", "copy the model to every node")
    broken = sorted(name for name, size in files.items() if size < 0)
    if broken:
        return _unreachable(path, node, broken, f.unreachable_links)
    if head is not None and node != c.head and head.model:
        found = differences(head.model, files).labelled(
            "missing", "not on the head", "size differs"
        )
        problems = [
            f"{label}: {', '.join(names[:3])}{' ...' if len(names) > 3 else ''}"
            for label, names in found
        ]
        if problems:
            cause = f"{path} differs from {c.head.name}'s: {'; '.join(problems)}"
            return failed("model", node.name, cause, "copy the model from the head again")
    if was and (changed := stamps.changed(path, was, files, f.model_mtimes)):
        return failed("model", node.name, changed, stamps.HINT)
    total = sum(files.values())
    return passed("model", node.name, f"{path}: {len(files)} files, {total / 1e9:.2f} GB")


def _unreachable(path: str, node: Node, broken: list[str], links: dict[str, str]) -> Check:
    """Symlinks the container cannot follow: what an HF download with --local-dir left behind
    (its files link into a cache outside the model folder, which the stack does not mount)."""
    first = broken[0]
    if first in links:
        cause = f"{path}: {first} links to {links[first]}, which the containers cannot see"
        cause += f" ({len(broken)} such files)" if len(broken) > 1 else ""
    else:
        cause = f"{path}: dangling symlinks: {', '.join(broken[:3])}"
    hint = f"copy real files into {path} (cp -rL), or sync-model from a node that has them"
    return failed("model", node.name, cause, hint)


def _shm(node: Node, f: Facts) -> Check:
    size = f.shm_bytes
    if size < SHM_MIN:
        cause = f"/dev/shm is {size / 2**20:.0f} MiB in the container, at least 1024 MiB needed"
        return failed("shm", node.name, cause, "ipc: host with a larger /dev/shm on the node")
    return passed("shm", node.name, f"/dev/shm {size / 2**30:.1f} GiB")


def _neighbours(c: Cluster, node: Node, others: list[Claim], f: Facts, notes: list[str]) -> Check:
    """Another cluster on the node: no port of ours among its ports, and together no more GPU
    memory than the node has, nor object stores larger than /dev/shm. `notes`: claims.apart's."""
    if not others:
        return passed("clusters", node.name, "no other cluster runs here")
    found = clashes(c, node.name, others, f.shm_bytes)
    names = ", ".join(f"'{o.cluster}'" for o in others)
    if found:
        hint = "another name, another vllm.port (every port follows it) or less memory"
        return failed("clusters", node.name, "; ".join(found), hint)
    return passed(
        "clusters", node.name, "; ".join([f"beside {names}: no port or memory clash", *notes])
    )


def _memlock(c: Cluster, node: Node, f: Facts) -> Check:
    limit = "unlimited" if f.memlock == -1 else f"{f.memlock // 1024} KiB"
    if not c.settings.memlock_unlimited:
        return skipped("memlock", node.name, f"{limit}; no RDMA in profile {c.profile}")
    if f.memlock != -1:
        cause = f"locked memory is limited to {limit} in the container: RDMA registration fails"
        hint = "ulimits memlock -1 (the dgx-spark profile sets it)"
        return failed("memlock", node.name, cause, hint)
    return passed("memlock", node.name, "unlimited")


def _memory_monitor(c: Cluster, node: Node, f: Facts) -> Check:
    if c.backend != "ray":
        return skipped("mem-monitor", node.name, "backend native runs no Ray")
    if f.memory_monitor != "0":
        cause = f"{MEMORY_MONITOR}={f.memory_monitor}: Ray may kill workers during the load"
        return failed("mem-monitor", node.name, cause, f"{MEMORY_MONITOR}=0 on every node")
    return passed("mem-monitor", node.name, f"{MEMORY_MONITOR}=0")


def _hardware(c: Cluster, node: Node, f: Facts, serving: bool) -> list[Check]:
    return hardware.checks(c, node, f.rdma, f.gpus, f.hardware, serving)


def _versions(nodes: list[Node], facts: dict[str, Facts]) -> Check:
    if not nodes:
        return skipped("versions", "all", "no node answered")
    first = nodes[0]
    for name in ("python", "vllm", "ray", "torch"):
        seen = {n.name: facts[n.name].versions.get(name) for n in nodes}
        if len(set(seen.values())) > 1:
            listed = ", ".join(f"{n} {v or 'absent'}" for n, v in seen.items())
            return failed("versions", "all", f"{name} differs: {listed}", "one image on every node")
    shown = ", ".join(f"{k} {v}" for k, v in facts[first.name].versions.items() if v)
    return passed("versions", "all", f"identical on every node: {shown}")


def _api_port(c: Cluster, head: Facts, running: Running) -> Check:
    if running.serve or running.door:
        holder = "front door" if running.door else "serve"
        return passed("api-port", c.head.name, f"port {c.vllm.port} is this stack's {holder}")
    if head.api_port_free is False:
        cause = f"port {c.vllm.port} on {c.head.ip} is already in use"
        return failed("api-port", c.head.name, cause, "stop what listens there or set vllm.port")
    return passed("api-port", c.head.name, f"port {c.vllm.port} is free")


def as_json(checks: list[Check]) -> str:
    return json.dumps([asdict(c) for c in checks], indent=2)
