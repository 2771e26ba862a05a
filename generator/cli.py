"""The command line. The only module that prints or exits; everything else raises."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from python_on_whales import DockerException
from rich.console import Console

from generator import (
    __version__,
    config,
    lock,
    observe,
    output,
    reference,
    secrets,
    sync,
    units,
    workflow,
)
from generator import checks as checking
from generator import preflight as preflight_checks
from generator import watch as watching
from generator.deploy import Timeouts
from generator.errors import DockerError, VllmComposeError, reason

app = typer.Typer(
    help="Render and run per-node Docker Compose stacks for one vLLM model across several nodes.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
out = Console(highlight=False, soft_wrap=True, markup=False)
err = Console(stderr=True, highlight=False, soft_wrap=True, markup=False)

ConfigArg = Annotated[Path, typer.Argument(help="The cluster config (YAML).", show_default=False)]
UpdateLockOpt = Annotated[
    bool, typer.Option("--update-lock", help="Re-lock from the head first, accepting drift.")
]
OutdirOpt = Annotated[
    Path | None, typer.Option("-o", "--output", help="Compose folders \\[default: compose/NAME].")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
IntervalOpt = Annotated[float, typer.Option(min=1, help="watch: seconds between checks.")]
DeadlineOpt = Annotated[
    float, typer.Option(min=1, help="watch: seconds the canary completion may take.")
]
FailuresOpt = Annotated[
    int, typer.Option(min=1, help="watch: failed checks in a row before a recovery.")
]
RecoveriesOpt = Annotated[
    int,
    typer.Option(
        min=0, help="watch: recoveries in a row before taking the group down and stopping."
    ),
]
BackoffOpt = Annotated[
    float, typer.Option(min=0, help="watch: seconds before the first recovery; doubles up to 300.")
]
DEFAULT = watching.Policy()


def _progress(line: str) -> None:
    err.print(f"  {line}")


# What a command opened (a read-only command's temporary compose folder), closed by main().
_resources = contextlib.ExitStack()


def _opened(path: Path, outdir: Path | None, **how: Any) -> workflow.Opened:
    opened = _resources.enter_context(workflow.opened(path, outdir, _progress, **how))
    _show(opened)
    return opened


def _show(opened: workflow.Opened) -> None:
    """What opening the config did: warnings, generated secrets, files changed (on stderr:
    stdout stays the command's, `status --json`)."""
    for warning in config.warnings(opened.cluster):
        err.print(f"warning: {warning}")
    if opened.secrets:
        _generated(opened.secrets)
    if opened.secrets is None:
        return  # rendered into a temporary folder
    for change in opened.plan.changes:
        if change.action != "identical":
            err.print(_change_line(change, dry_run=False))
    for folder in opened.plan.stale:
        err.print(f"note: {folder} is not a node of {opened.cluster.name} any more; left as it is")


def _generated(found: secrets.Local) -> None:
    if "api_key" in found.generated:
        err.print(
            f"api key: generated {found.generated['api_key']} (mode 0600); clients send it as"
            " 'Authorization: Bearer <key>'"
        )
    if "ray_token" in found.generated:
        err.print(
            f"ray token: generated {found.generated['ray_token']} (mode 0600); Ray's nodes"
            " authenticate with it"
        )


def _change_line(change: output.Change, dry_run: bool) -> str:
    secret = "  (secret: mode 0600, contents never shown)" if change.file.secret else ""
    return f"{'would ' if dry_run else ''}{change.action:>9}  {change.path}{secret}"


@app.command()
def validate(path: ConfigArg) -> None:
    """Check a config; print the nodes and their roles."""
    c = config.load(path)
    for warning in config.warnings(c):
        err.print(f"warning: {warning}")
    parallel = f"TP {c.tensor_parallel_size} x PP {c.vllm.pipeline_parallel_size}"
    out.print(f"{path}: valid; backend {c.backend}, {parallel} over {c.gpu_total} GPUs")
    for node in c.nodes:
        role = "head" if node == c.head else "worker"
        where = f"{node.ip} on {c.interface_of(node)}, context {node.docker_context}"
        out.print(f"  {node.name}: {role}, {where}")


@app.command("render")
def render_cmd(
    path: ConfigArg,
    outdir: OutdirOpt = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show the plan and diffs only.")
    ] = False,
) -> None:
    """Render one compose folder per node: compose.yaml, the wrapper's build context and the
    secret files its stack uses (secrets/, mode 0600), so the folder alone starts with
    `docker compose up -d` on its node."""
    c = config.load(path)
    for warning in config.warnings(c):
        err.print(f"warning: {warning}")
    cluster, _ = workflow.pinned(path, c, strict=True)
    found = secrets.local(path, cluster, generate=not dry_run)
    _generated(found)
    for name, missing in found.missing.items():
        out.print(f"would generate {missing} ({name}, mode 0600)")
    plan = workflow.plan(path, cluster, outdir, found)
    for change in plan.changes:
        out.print(_change_line(change, dry_run))
        if dry_run and change.action != "identical":
            out.print(change.diff(), end="")
    for folder in plan.stale:
        err.print(f"note: {folder} is not a node of {cluster.name} any more; left as it is")
    if not dry_run:
        output.apply(plan.changes)


@app.command()
def up(
    path: ConfigArg,
    outdir: OutdirOpt = None,
    join_timeout: Annotated[int, typer.Option(help="Seconds for the workers to join Ray.")] = 300,
    serve_timeout: Annotated[
        int | None, typer.Option(help="Seconds for serve's gate \\[default: vllm.startup_timeout].")
    ] = None,
    skip_preflight: Annotated[
        bool, typer.Option("--skip-preflight", help="Start without the preflight checks.")
    ] = False,
    update_lock: UpdateLockOpt = False,
    keep_on_failure: Annotated[
        bool,
        typer.Option("--keep-on-failure", help="Leave a group that failed to start as it is."),
    ] = False,
    and_watch: Annotated[
        bool, typer.Option("--watch", help="Once ready, keep it serving as `watch` does.")
    ] = False,
    interval: IntervalOpt = DEFAULT.interval,
    deadline: DeadlineOpt = DEFAULT.deadline,
    failures: FailuresOpt = DEFAULT.failures,
    max_recoveries: RecoveriesOpt = DEFAULT.max_recoveries,
    backoff: BackoffOpt = DEFAULT.backoff,
) -> None:
    """Render, preflight, then start every node over its context: head's Ray, workers' Ray,
    serve. A start phase that fails takes the group down again. With a lock beside the config,
    the locked image and model or an error."""
    timeouts = Timeouts(join=join_timeout, serve=serve_timeout)
    opened = _opened(
        path, outdir, strict=True, update_lock=update_lock, with_secrets=True, timeouts=timeouts
    )
    if update_lock and opened.locked:
        _locked(opened.locked, path)
    result = opened.deployment.up(checks=not skip_preflight, keep_on_failure=keep_on_failure)
    for node, what in result.images.items():
        out.print(f"image on {node}: {what}")
    out.print("phases: " + ", ".join(f"{name} {seconds:.1f}s" for name, seconds in result.phases))
    out.print(f"ready: {result.endpoint}")
    if and_watch:
        policy = watching.Policy(interval, deadline, failures, max_recoveries, backoff)
        _watch(opened, policy)


@app.command()
def watch(
    path: ConfigArg,
    outdir: OutdirOpt = None,
    interval: IntervalOpt = DEFAULT.interval,
    deadline: DeadlineOpt = DEFAULT.deadline,
    failures: FailuresOpt = DEFAULT.failures,
    max_recoveries: RecoveriesOpt = DEFAULT.max_recoveries,
    backoff: BackoffOpt = DEFAULT.backoff,
) -> None:
    """Keep a started group serving: every INTERVAL s check every service on every node, Ray's
    nodes and a real completion; on failure recreate the whole group in order, with back-off;
    after MAX_RECOVERIES in a row take it down and stop, saying why. Ctrl-C leaves it as it is."""
    opened = _opened(path, outdir, strict=True, with_secrets=True)
    _watch(opened, watching.Policy(interval, deadline, failures, max_recoveries, backoff))


def _watch(opened: workflow.Opened, policy: watching.Policy) -> None:
    def report(line: str) -> None:
        err.print(f"{time.strftime('%H:%M:%S')} {line}")

    report(
        f"watch: checking every {policy.interval:g} s (canary deadline {policy.deadline:g} s);"
        f" Ctrl-C stops watching and leaves the group as it is"
    )
    try:
        watching.watch(opened.deployment, policy, report)
    except KeyboardInterrupt:
        report("watch: stopped; the group is left as it is")
        raise typer.Exit(130) from None


@app.command("secrets")
def secrets_(path: ConfigArg, outdir: OutdirOpt = None) -> None:
    """Write the secret files (the API key, generated beside the config when missing, and the HF
    token) onto every node that needs them, as `up` does; for stacks started over contexts."""
    fleet = _opened(path, outdir, with_secrets=True).fleet
    fleet.contexts_answer()
    fleet.images()
    fleet.push_secrets()
    for node in fleet.cluster.nodes:
        out.print(f"{node.name}: secrets written")


@app.command("lock")
def lock_(path: ConfigArg, outdir: OutdirOpt = None) -> None:
    """Write CONFIG's lock beside it: the base image's ID, the versions inside it, the model's
    manifest (every file hashed on the head), the config's hash. render and up then use it."""
    found = secrets.local(path, config.load(path))
    _generated(found)
    _locked(workflow.relock(path, outdir, _progress, found), path)


def _locked(resolved: lock.Lock, path: Path) -> None:
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
    opened = _opened(path, outdir, strict=True, with_secrets=True)
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


@app.command()
def preflight(path: ConfigArg, outdir: OutdirOpt = None, as_json: JsonOpt = False) -> None:
    """Check every node before starting: contexts, interface and IP, reach between every pair,
    one image and the same versions, the model's files, /dev/shm, memlock, Ray settings, ports.
    Writes the secret files onto the nodes first, as up does: the checks run in the stack."""
    checks, seconds = preflight_checks.run(_opened(path, outdir, with_secrets=True).fleet)
    failures = [c for c in checks if c.status == "fail"]
    if as_json:
        out.print(checking.as_json(checks))
    else:
        for check in checks:
            out.print(check.line())
        out.print(f"{len(checks)} checks in {seconds:.1f} s: {len(failures)} failed")
    if failures:
        first = failures[0]
        raise VllmComposeError(
            f"preflight: {len(failures)} failed; first: {first.node}: {first.cause}"
        )


@app.command()
def down(path: ConfigArg, outdir: OutdirOpt = None) -> None:
    """Stop and remove the stack on every node, in parallel, volumes included."""
    outcome = _opened(path, outdir).fleet.down()
    for node, what in outcome.items():
        out.print(f"{node}: {what}")
    failed = [node for node, what in outcome.items() if what != "removed"]
    if failed:
        raise DockerError(failed[0], f"not cleaned ({len(failed)} of {len(outcome)} nodes failed)")


@app.command()
def status(path: ConfigArg, outdir: OutdirOpt = None, as_json: JsonOpt = False) -> None:
    """Per node: its services and their health, and whether Ray sees the node at its IP."""
    rows = observe.status(_opened(path, outdir).fleet)
    if as_json:
        out.print(json.dumps([r.model_dump(exclude_unset=True) for r in rows], indent=2))
        return
    for row in rows:
        out.print(_status_line(row))
        for s in row.services:
            out.print(f"  {s.service}: {s.state}{f', {s.health}' if s.health else ''}")


def _status_line(row: observe.StatusRow) -> str:
    alive = row.ray_alive_at_ip
    ray = (
        ""
        if alive is None
        else ", alive in Ray at its IP"
        if alive
        else ", NOT alive in Ray at its IP"
    )
    line = f"{row.node} ({row.ip}){ray}"
    return f"{line}: unreachable: {row.error}" if row.error else line


@app.command()
def logs(
    path: ConfigArg,
    outdir: OutdirOpt = None,
    node: Annotated[str | None, typer.Option("--node", help="Only this node.")] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep following.")] = False,
) -> None:
    """Logs of every node's services, merged, each line prefixed by its node."""
    fleet = _opened(path, outdir).fleet
    names = [n.name for n in fleet.cluster.nodes]
    if node is not None and node not in names:
        raise VllmComposeError(f"no node '{node}' in {path}", f"nodes: {', '.join(names)}")
    for line in observe.logs(fleet, node, follow):
        out.print(line)


@app.command()
def schema(
    markdown: Annotated[
        bool, typer.Option("--markdown", help="The README's table instead.")
    ] = False,
) -> None:
    """Print the config's JSON schema (for editors)."""
    out.print(reference.markdown() if markdown else reference.schema(), end="")


@app.command()
def version() -> None:
    """Print the version."""
    out.print(__version__)


def main() -> None:
    try:
        app()
    except VllmComposeError as e:
        for line in e.lines():
            err.print(line)
        sys.exit(e.exit_code)
    except DockerException as e:  # one that no layer named: still one line, never a traceback
        err.print(f"docker failed: {reason(e)}")
        sys.exit(1)
    finally:
        _resources.close()
