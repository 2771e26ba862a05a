"""What a failed group leaves behind, and what `diagnose` gathers: a bundle in the config's state
folder, CONFIG-STEM.state/logs/<UTC time>/ and the same as <UTC time>.tar.gz to send. Before
`watch` recreates a group or takes it down, and before `up` rolls a failed start back, one is
written, so the cause outlives the containers.

Per node: every service's log (exited containers too), each container's state and configuration
(`<node>.containers.json`), the compose folder as rendered (no secret file), and which network
NCCL used as its log says (`summary.json`, with the phases of the start and Ray's node table when
known). Every secret's contents and every variable named like a secret read `<redacted>`.
"""

from __future__ import annotations

import json
import re
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from python_on_whales import Container, DockerException

from generator.base import nccl, sidefiles
from generator.base.containers import health_of, service_of
from generator.base.errors import UnsafePath, VllmComposeError, reason
from generator.base.fanout import each
from generator.config import Node
from generator.nodes import doorreplicas
from generator.nodes.fleet import Fleet
from generator.operations import preflight
from generator.stack.output import write_atomic

LINES = 20000  # per node: the last lines of every service, enough for a vLLM start and its end
TIMEOUT = 30  # per node
REDACTED = "<redacted>"
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)
RENDERED = ("compose.yaml", "contexts.env", "Dockerfile")  # of a node's folder; never secrets/
LAST_START = "last-start.json"  # in the bundles' folder: the phases of the last start, timed


def write_bundle(fleet: Fleet, root: Path, why: str, extra: dict[str, Any] | None = None) -> Path:
    """The bundle, written into root/<UTC time>/ and archived beside it; says where, or why a
    node's part could not be read; fails only when a folder of it is a link. `extra`: more for
    summary.json."""
    folder = sidefiles.folder(
        sidefiles.folder(root) / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    )
    hide = _redactor(fleet)
    outcome = each(
        {n.name: _node_part(fleet, n, folder, hide) for n in fleet.cluster.nodes}, TIMEOUT
    )
    failed = [f"{n}: {reason(e)}" for n, e in outcome.items() if isinstance(e, BaseException)]
    summary = {"why": why, "cluster": fleet.cluster.name, "last_start": _read(root / LAST_START)}
    summary |= extra or {}
    summary["nodes"] = {n: part for n, part in outcome.items() if isinstance(part, dict)}
    write_atomic(folder / "summary.json", hide(json.dumps(summary, indent=2, default=str)) + "\n")
    archive = _archive(folder)
    saved = len(outcome) - len(failed)
    fleet.report(f"{why}: logs of {saved} node(s) saved in {folder} (and {archive.name})")
    for line in failed:
        fleet.report(f"{why}: logs not saved: {line}")
    return archive


def last_start(root: Path, start: dict[str, object]) -> None:
    """How the last start went (its phases, timed; what failed), for the next bundle."""
    sidefiles.folder(root)
    write_atomic(root / LAST_START, json.dumps(start, indent=2) + "\n")


def _read(path: Path) -> object:
    try:
        return json.loads(sidefiles.read(path))
    except (OSError, ValueError, UnsafePath):
        return None


def _node_part(
    fleet: Fleet, node: Node, folder: Path, hide: Callable[[str], str]
) -> Callable[[], dict[str, Any]]:
    def run() -> dict[str, Any]:
        log = fleet.all_logs(node, LINES)
        write_atomic(folder / f"{node.name}.log", hide(log))
        found = [_container(c) for c in fleet.containers(node)]
        text = json.dumps(found, indent=2, default=str)
        write_atomic(folder / f"{node.name}.containers.json", hide(text) + "\n")
        rendered = fleet.outdir / node.name
        for name in RENDERED:
            if (rendered / name).is_file():
                (folder / "compose" / node.name).mkdir(parents=True, exist_ok=True)
                text = (rendered / name).read_text(encoding="utf-8")
                write_atomic(folder / "compose" / node.name / name, hide(text))
        states = {c["service"]: c["state"]["status"] for c in found}
        return {"containers": states, "nccl": nccl.used(log)}

    return run


def _container(c: Container) -> dict[str, Any]:
    """What `docker inspect` says that explains a failure; variables named like a secret hidden."""
    env = [_hidden(e) for e in c.config.env or []]
    state = c.state
    health = health_of(state)
    return {
        "name": c.name,
        "service": service_of(c),
        "image": c.config.image,
        "state": {
            "status": state.status,
            "exit_code": state.exit_code,
            "oom_killed": state.oom_killed,
            "started_at": state.started_at,
            "finished_at": state.finished_at,
            "health": health,
            "error": state.error,
        },
        "restart_count": c.restart_count,
        "entrypoint": c.config.entrypoint,
        "command": c.config.cmd,
        "environment": env,
        "mounts": [f"{m.source or m.name} -> {m.destination}" for m in c.mounts or []],
        "network_mode": c.host_config.network_mode,
    }


def _hidden(variable: str) -> str:
    name = variable.partition("=")[0]
    return f"{name}={REDACTED}" if SECRET_NAME.search(name) else variable


def _redactor(fleet: Fleet) -> Callable[[str], str]:
    """Every secret's contents, wherever they appear in a text, replaced."""
    values = []
    for path in fleet.secret_files.values():
        try:
            value = path.read_text(encoding="utf-8").strip()
        except OSError:
            continue
        if len(value) >= 8:
            values.append(value)

    def hide(text: str) -> str:
        for value in values:
            text = text.replace(value, REDACTED)
        return text

    return hide


def _archive(folder: Path) -> Path:
    archive = folder.with_name(f"{folder.name}.tar.gz")
    partial = archive.with_name(f".{archive.name}.partial")
    with tarfile.open(partial, "w:gz") as tar:
        tar.add(folder, arcname=folder.name)
    partial.replace(archive)
    return archive


def diagnose(fleet: Fleet, folder: Path, groups: list[Fleet]) -> Path:
    """`diagnose`: the bundle, with every node's preflight facts and Ray's nodes beside the logs
    (what could not be gathered is said in their place); with replicas (`groups`, each one's
    fleet), each one's nodes, its state and share at the door, and its own Ray's nodes."""
    extra: dict[str, object] = {}
    try:
        failed, gathered = preflight.gather(fleet, fleet.cluster.nodes)
        facts = {node: f.model_dump(mode="json") for node, f in gathered.items()}
        extra["preflight"] = {"failed": [c.line() for c in failed], "facts": facts}
    except (VllmComposeError, DockerException) as e:
        extra["preflight"] = f"not gathered: {e}"
    if len(groups) > 1:
        extra["replicas"] = _replicas(fleet, groups)
    if fleet.cluster.backend == "ray" and len(groups) > 1:  # each replica's own Ray cluster
        extra["ray_nodes"] = {f"replica {i + 1}": g.ray_nodes() for i, g in enumerate(groups)}
    elif fleet.cluster.backend == "ray":
        extra["ray_nodes"] = fleet.ray_nodes()
    return write_bundle(fleet, folder, "diagnose", extra)


def _replicas(fleet: Fleet, groups: list[Fleet]) -> list[dict[str, object]]:
    """Each replica's nodes and, where the door answers, its state and share there."""
    found: list[dict[str, object]] = [
        {"replica": i + 1, "nodes": [n.name for n in g.cluster.nodes]} for i, g in enumerate(groups)
    ]
    try:
        seen = doorreplicas.shares(fleet)
    except (VllmComposeError, DockerException) as e:
        return [{**row, "door": f"not read: {reason(e)}"} for row in found]
    for row, (door, share) in zip(found, seen, strict=False):
        row |= {"door": door.status, "requests": door.total, "share_percent": round(100 * share, 1)}
    return found
