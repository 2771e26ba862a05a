"""Opening a config for a command, as data: the cluster (pinned by its lock when it has one), the
lock, the secret files, the render plan, and one deployment over the nodes' contexts.

Commands that start or check things write the node folders (and the secret files into them);
read-only ones (`status`, `logs`, `down`) render into a temporary folder and write nothing of the
user's.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from generator import config
from generator.base import sidefiles
from generator.base.errors import DriftError
from generator.base.fanout import Report
from generator.nodes import secrets, survey
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
    return _relocked(path, cluster, outdir, report, found)[0]


def _relocked(
    path: Path, cluster: config.Cluster, outdir: Path | None, report: Report, found: secrets.Local
) -> tuple[lock.Lock, survey.Seen | None]:
    """relock, and the look at the nodes placing the cluster took (for what opens it next)."""
    placed, seen = place(cluster, report)
    rendered = plan(path, placed, outdir, found)
    output.apply(rendered.changes)
    fleet = Fleet(placed, rendered.folder, report, found.files, path.name)
    resolved = lock.resolve(fleet, cluster.config_hash(), slots.given(cluster))
    lock.write(path, resolved)
    return resolved, seen


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


@dataclass(frozen=True)
class _How:
    update_lock: bool
    strict: bool
    entry: history.Entry | None


def _locked_and_placed(
    path: Path,
    cluster: config.Cluster,
    outdir: Path | None,
    report: Report,
    found: secrets.Local | None,
    how: _How,
) -> tuple[config.Cluster, lock.Lock | None, survey.Seen | None]:
    """The cluster pinned to the lock it opens with, at its API port, once: the lock resolved
    now and written (`update_lock`, placing the cluster on the way), the served stack's
    (`entry`), else the file's (drift refused when `strict`); and the look placing it took."""
    locked: lock.Lock | None
    seen: survey.Seen | None = None
    if how.update_lock and found:
        locked, seen = _relocked(path, cluster, outdir, report, found)
    else:
        locked = how.entry.locked if how.entry else pinned(path, cluster, how.strict)[1]
    cluster = lock.pinned(cluster, locked) if locked else cluster
    if seen is None:  # a relock placed it, and its lock holds the port
        cluster, seen = place(cluster, report)
    return cluster, locked, seen


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
    cluster = config.parse(text, str(path))
    found = _secrets(path, cluster, outdir) if with_secrets else None
    how = _How(update_lock, strict, entry)
    cluster, locked, seen = _locked_and_placed(path, cluster, outdir, report, found, how)
    with contextlib.ExitStack() as stack:
        folder = outdir
        if not with_secrets:
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="vllm-compose-")))
        rendered = plan(path, cluster, folder, found)
        output.apply(rendered.changes)
        fleet = Fleet(cluster, rendered.folder, report, found.files if found else {}, path.name)
        deployment = Deployment(
            fleet,
            locked=locked,
            lock_file=lock.path_for(path),
            accept_drift=update_lock,  # just re-locked
            logs=sidefiles.Beside(path).logs,
            stamped=stamps.read(path, cluster.model.path),
            timeouts=timeouts or Timeouts(),
            seen=seen,
        )
        yield Opened(cluster, locked, found, rendered, deployment, text)
