"""Opening a config for a command, as data: the cluster (pinned by its lock when it has one), the
lock, the secret files, the render plan, and one deployment over the nodes' contexts.

Commands that start or check things write the node folders (and the secret files into them);
read-only ones (`status`, `logs`, `down`) render into a temporary folder and write nothing of the
user's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from generator import config
from generator.base import sidefiles
from generator.base.errors import DriftError
from generator.base.fanout import Report
from generator.nodes import images, secrets, survey
from generator.nodes.fleet import Fleet
from generator.operations import history, lock, stamps
from generator.operations.deploy import Deployment, Timeouts
from generator.stack import output, render, slots


@dataclass
class Plan:
    """What rendering writes: every file's change, and node folders no node uses any more."""

    folder: Path
    changes: list[output.Change]
    stale: list[Path]


@dataclass
class Opened:
    cluster: config.Cluster  # as rendered: with a lock, its image is the locked ID
    locked: lock.Lock | None
    secrets: secrets.Local | None
    plan: Plan
    deployment: Deployment
    config_text: str  # as read: what history records once the stack serves

    @property
    def fleet(self) -> Fleet:
        return self.deployment.fleet

    @functools.cached_property
    def groups(self) -> list[Deployment]:
        """A deployment per replica (each over its own nodes, saying which it is), the first
        with the front door; the one deployment when the cluster is one group."""
        fleet = self.fleet
        if fleet.cluster.replicas == 1:
            return [self.deployment]
        return [
            dataclasses.replace(self.deployment, fleet=Fleet(
                group, fleet.outdir, _said(fleet.report, f"replica {group.replica + 1}: "),
                fleet.secret_files, fleet.source))
            for group in fleet.cluster.groups
        ]  # fmt: skip


def _said(report: Report, prefix: str) -> Report:
    return lambda line: report(prefix + line)


def folder_for(cluster: config.Cluster, outdir: Path | None) -> Path:
    """Where the node folders go, refused (before anything is written) when it cannot be."""
    folder = outdir or Path("compose") / cluster.name
    output.check_folder(folder)
    return folder


def plan(
    path: Path, cluster: config.Cluster, outdir: Path | None, found: secrets.Local | None
) -> Plan:
    """The node folders rendered from the config; with `found`, each carries its secrets."""
    folder = folder_for(cluster, outdir)
    contents = {n: p.read_text(encoding="utf-8") for n, p in found.files.items()} if found else None
    files = render.render(cluster, path.name, contents)
    return Plan(folder, output.plan(files, folder), output.stale(files, folder))


def planned(
    path: Path, loaded: config.Cluster, outdir: Path | None, generate: bool
) -> tuple[config.Cluster, secrets.Local, Plan]:
    """`render`'s work, nothing written but missing secret files (with `generate`): the cluster
    pinned to its lock (drift refused), the output folder refused before any secret is
    generated, the secret files, and the plan."""
    cluster, _ = pinned(path, loaded, strict=True)
    folder_for(cluster, outdir)
    found = secrets.local(path, cluster, generate=generate)
    return cluster, found, plan(path, cluster, outdir, found)


def pinned(
    path: Path, cluster: config.Cluster, strict: bool
) -> tuple[config.Cluster, lock.Lock | None]:
    """The cluster with its base image named by its lock's ID, when it has a lock. `strict`
    (commands that start things): a config changed since its lock is an error."""
    locked = lock.read(path)
    if not locked:
        return cluster, None
    drift = lock.config_drift(cluster, locked) if strict else []
    if drift:
        raise DriftError(drift, lock.path_for(path))
    return lock.pinned(cluster, locked), locked


def relock(
    path: Path,
    cluster: config.Cluster,
    outdir: Path | None,
    report: Report,
    found: secrets.Local,
) -> lock.Lock:
    """Resolve the config (as loaded, without its lock) on its head now and write the lock."""
    return _relocked(path, cluster, outdir, report, found).locked


@dataclass
class _Relocked:
    locked: lock.Lock
    seen: survey.Seen | None  # the look placing the cluster took
    plan: Plan
    fleet: Fleet


def _relocked(
    path: Path, cluster: config.Cluster, outdir: Path | None, report: Report, found: secrets.Local
) -> _Relocked:
    """relock, once: the cluster placed, pinned to the base image's ID on its head, rendered and
    its wrapper built on the head, all as the command that opens it goes on to use them."""
    placed, seen = place(cluster, report)
    report(f"lock: resolving {cluster.image} on {placed.head.name}")
    base = images.held(placed.head.name, placed.head.docker_context, placed.image)
    rendered, fleet = _rendered(path, placed.pinned_to(base.id), outdir, report, found)
    resolved = lock.resolve(fleet, base, cluster.config_hash(), slots.given(cluster))
    lock.write(path, resolved)
    return _Relocked(resolved, seen, rendered, fleet)


def _rendered(
    path: Path,
    cluster: config.Cluster,
    folder: Path | None,
    report: Report,
    found: secrets.Local | None,
) -> tuple[Plan, Fleet]:
    """The node folders written, and the fleet over them."""
    rendered = plan(path, cluster, folder, found)
    output.apply(rendered.changes)
    files = found.files if found else {}
    return rendered, Fleet(cluster, rendered.folder, report, files, path.name)


def place(cluster: config.Cluster, report: Report) -> tuple[config.Cluster, survey.Seen | None]:
    """The cluster at its API port: the config's or lock's, else where it runs or the first free
    slot on its nodes (slots.py); and the look this took at the clusters on the nodes, stopped
    ones too (None when the port is given: no look)."""
    if slots.given(cluster):
        return cluster, None
    seen = survey.of(cluster, stopped=True)
    placed, why = slots.placed(cluster, survey.running(seen))
    if why:
        report(f"ports: {why}")
    return placed, seen


def _secrets(path: Path, cluster: config.Cluster, outdir: Path | None) -> secrets.Local:
    """The secret files, the output folder checked first: nothing is generated before it is
    refused."""
    folder_for(cluster, outdir)
    return secrets.local(path, cluster)


@contextlib.contextmanager
def opened(
    path: Path,
    outdir: Path | None,
    report: Report,
    *,
    strict: bool = False,
    update_lock: bool = False,
    with_secrets: bool = False,
    timeouts: Timeouts | None = None,
    entry: history.Entry | None = None,
) -> Iterator[Opened]:
    """The config opened for a command. `update_lock`: re-lock from the head first, accepting
    drift. `with_secrets`: the secret files beside the config (the defaults generated when
    missing) go into the node folders and onto the nodes. Without it the command only reads, and
    its compose files live in a temporary folder for as long as it runs. `entry`: the config and
    lock of a stack that served before (history.py), in place of the config file's."""
    text = entry.config_text if entry else config.read(path)
    cluster = config.parse(text, str(entry.folder / history.CONFIG) if entry else str(path))
    found = _secrets(path, cluster, outdir) if with_secrets else None
    locked: lock.Lock | None
    with contextlib.ExitStack() as stack:
        if update_lock and found:
            done = _relocked(path, cluster, outdir, report, found)
            locked, seen, rendered, fleet = done.locked, done.seen, done.plan, done.fleet
        else:
            locked = entry.locked if entry else pinned(path, cluster, strict)[1]
            cluster, seen = place(lock.pinned(cluster, locked) if locked else cluster, report)
            folder = outdir if with_secrets else Path(stack.enter_context(_temporary()))
            rendered, fleet = _rendered(path, cluster, folder, report, found)
        deployment = Deployment(
            fleet,
            locked=locked,
            lock_file=lock.path_for(path),
            accept_drift=update_lock,  # just re-locked
            logs=sidefiles.Beside(path).logs,
            stamped=stamps.read(path, fleet.cluster.model.path),
            timeouts=timeouts or Timeouts(),
            seen=seen,
        )
        yield Opened(fleet.cluster, locked, found, rendered, deployment, text)


def _temporary() -> tempfile.TemporaryDirectory[str]:
    """The folder a read-only command renders into, gone when it ends."""
    return tempfile.TemporaryDirectory(prefix="vllm-compose-")
