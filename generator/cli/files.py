"""Commands that work on the config and the files: validate, render, lock, secrets, sync-model,
verify, schema, version."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from generator import __version__, config
from generator.base import units
from generator.base.errors import ListedError, VllmComposeError
from generator.cli.app import (
    ConfigArg,
    OutdirOpt,
    app,
    change_line,
    err,
    generated,
    open_config,
    out,
    progress,
)
from generator.config import reference
from generator.nodes import secrets
from generator.operations import lock, stamps, sync, verify, workflow
from generator.stack.output import apply

DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Show the plan and diffs only.")]


@app.command()
def validate(path: ConfigArg) -> None:
    """Check a config; print the nodes and their roles."""
    c = config.load(path)
    for warning in config.warnings(c):
        err.print(f"warning: {warning}")
    parallel = f"TP {c.tensor_parallel_size} x PP {c.vllm.pipeline_parallel_size}"
    each = f" each, {c.replicas} replicas behind the door" if c.replicas > 1 else ""
    out.print(f"{path}: valid; backend {c.backend}, {parallel} over {c.gpu_total} GPUs{each}")
    for group in c.groups:
        of = f" of replica {group.replica + 1}" if c.replicas > 1 else ""
        for node in group.nodes:
            role = "head" if node == group.head else "worker"
            where = f"{node.ip} on {c.interface_of(node)}, context {node.docker_context}"
            out.print(f"  {node.name}: {role}{of}, {where}")


@app.command("render")
def render_cmd(
    path: ConfigArg,
    outdir: OutdirOpt = None,
    dry_run: DryRunOpt = False,
) -> None:
    """Render one compose folder per node: compose.yaml, the wrapper's build context and the
    secret files its stack uses (secrets/, mode 0600), so the folder alone starts with
    `docker compose up -d` on its node."""
    c = config.load(path)
    for warning in config.warnings(c):
        err.print(f"warning: {warning}")
    cluster, found, plan = workflow.planned(path, c, outdir, generate=not dry_run)
    generated(found)
    for name, missing in found.missing.items():
        out.print(f"would generate {missing} ({name}, mode 0600)")
    for change in plan.changes:
        out.print(change_line(change, dry_run))
        if dry_run and change.action != "identical":
            out.print(change.diff(), end="")
    for folder in plan.stale:
        err.print(f"note: {folder} is not a node of {cluster.name} any more; left as it is")
    if not dry_run:
        apply(plan.changes)


@app.command("secrets")
def secrets_(path: ConfigArg, outdir: OutdirOpt = None) -> None:
    """Write the secret files (the API key, generated in the state folder when missing, and the HF
    token) onto every node that needs them, as `up` does; for stacks started over contexts."""
    fleet = open_config(path, outdir, with_secrets=True).fleet
    fleet.contexts_answer()
    fleet.images()
    fleet.push_secrets()
    for node in fleet.cluster.nodes:
        out.print(f"{node.name}: secrets written")


@app.command("lock")
def lock_(path: ConfigArg, outdir: OutdirOpt = None) -> None:
    """Write CONFIG's lock beside it: the base image's ID, the versions inside it, the model's
    manifest (every file hashed on the head), the config's hash. render and up then use it."""
    cluster = config.load(path)
    workflow.folder_for(cluster, outdir)
    found = secrets.local(path, cluster)
    generated(found)
    locked(workflow.relock(path, cluster, outdir, progress, found), path)


def locked(resolved: lock.Lock, path: Path) -> None:
    files = resolved.model.files
    size = sum(f.size for f in files.values())
    out.print(f"locked {lock.path_for(path)}: {resolved.image.ref} = {resolved.image.id}")
    versions = ", ".join(f"{k} {v}" for k, v in sorted(resolved.versions.items()) if v)
    out.print(f"  versions: {versions}")
    revision = resolved.model.revision or "none (not an HF cache snapshot)"
    out.print(f"  model: {len(files)} files, {size / 1e9:.2f} GB, revision {revision}")


@app.command("sync-model")
def sync_model(
    path: ConfigArg,
    outdir: OutdirOpt = None,
    source: Annotated[
        str | None, typer.Option("--from", help="The node to copy from [default: the head].")
    ] = None,
) -> None:
    """Copy the model from the head (or --from) to the same path on every other node, node to
    node; verified file by file against the manifest (the lock's, when there is one)."""
    opened = open_config(path, outdir, strict=True)  # its containers need no secret
    nodes = {n.name: n for n in opened.cluster.nodes}
    if source is not None and source not in nodes:
        raise VllmComposeError(f"no node '{source}' in {path}", f"nodes: {', '.join(nodes)}")
    chosen = nodes[source] if source else opened.cluster.head
    outcomes = sync.sync_model(opened.fleet, chosen, opened.locked)
    for node, outcome in outcomes.items():
        what = outcome.error or f"{units.size(outcome.moved)} moved, {outcome.kept} files kept"
        out.print(f"{node}: {'FAILED: ' if outcome.error else ''}{what}")
    failed = [node for node, outcome in outcomes.items() if outcome.error]
    if failed:
        raise VllmComposeError(
            f"sync-model: {len(failed)} of {len(outcomes)} nodes do not hold the model",
            "run sync-model again: files already correct are kept",
        )


@app.command("verify")
def verify_model(path: ConfigArg, outdir: OutdirOpt = None) -> None:
    """Hash every model file on every node (all at once, with progress) and compare them with the
    lock, or with the head's files without one; name each mismatch. Nodes found right are
    stamped (in the state folder): preflight then names a file changed since, unhashed."""
    opened = open_config(path, outdir, strict=True)  # its containers need no secret
    problems, files = verify.verify(opened.fleet, opened.locked, path)
    if problems:
        raise ListedError(
            f"verify: {len(problems)} mismatch{'es' if len(problems) != 1 else ''}",
            problems,
            "sync-model CONFIG copies them again (from the head, or --from NODE)",
        )
    against = "the lock" if opened.locked else f"{opened.cluster.head.name}'s files"
    nodes = len(opened.cluster.nodes)
    out.print(f"verify: {files} files on each of {nodes} nodes match {against}")
    out.print(f"stamped: {stamps.path_for(path)}")


@app.command()
def schema(
    markdown: Annotated[
        bool,
        typer.Option("--markdown", help="The config reference's table (docs/reference.md)."),
    ] = False,
) -> None:
    """Print the config's JSON schema (for editors)."""
    out.print(reference.markdown() if markdown else reference.schema(), end="")


@app.command()
def version() -> None:
    """Print the version."""
    out.print(__version__)
