"""The command line. The only module that prints or exits; everything else raises."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from generator import (
    __version__,
    config,
    deploy,
    errors,
    lock,
    output,
    reference,
    render,
    secrets,
    units,
)
from generator import preflight as preflight_checks
from generator import watch as watching
from generator.errors import DockerError, VllmComposeError

app = typer.Typer(
    help="Render and run per-node Docker Compose stacks for one vLLM model across several nodes.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

ConfigArg = Annotated[Path, typer.Argument(help="The cluster config (YAML).", show_default=False)]
UpdateLockOpt = Annotated[
    bool, typer.Option("--update-lock", help="Re-lock from the head first, accepting drift.")
]
OutdirOpt = Annotated[
    Path | None, typer.Option("-o", "--output", help="Compose folders \\[default: compose/NAME].")
]


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


def _load(path: Path) -> config.Cluster:
    cluster = config.load(path)
    for warning in config.warnings(cluster):
        err.print(f"warning: {warning}", markup=False)
    return cluster


def _progress(line: str) -> None:
    err.print(f"  {line}", markup=False)


def _render(
    path: Path,
    cluster: config.Cluster,
    outdir: Path | None,
    dry_run: bool = False,
    quiet: bool = True,
    found: secrets.Local | None = None,
) -> Path:
    """Render and write the node folders; with `found`, each carries its secret files."""
    target = outdir or Path("compose") / cluster.name
    contents = (
        {name: p.read_text(encoding="utf-8") for name, p in found.files.items()} if found else None
    )
    files = render.render(cluster, path.name, contents)
    changes = output.plan(files, target)
    # As a step of another command, what changed goes to stderr: stdout stays that command's
    # (`status --json`, `preflight --json`).
    shown = err if quiet else out
    for change in changes:
        if not (quiet and change.action == "identical"):
            secret = "  (secret: mode 0600, contents never shown)" if change.file.secret else ""
            action = f"{'would ' if dry_run else ''}{change.action:>9}"
            shown.print(f"{action}  {change.path}{secret}", markup=False)
        if dry_run and change.action != "identical":
            out.print(change.diff(), end="", markup=False)
    for folder in output.stale(files, target):
        err.print(
            f"note: {folder} is not a node of {cluster.name} any more; left as it is", markup=False
        )
    if not dry_run:
        output.apply(changes)
    return target


def _deployment(
    path: Path,
    outdir: Path | None,
    strict: bool = False,
    update_lock: bool = False,
    with_secrets: bool = False,
) -> deploy.Deployment:
    """The deployment of the config, pinned by its lock when it has one. `strict` (commands that
    start things): a config changed since its lock is an error; `update_lock` re-locks first;
    `with_secrets`: the secret files beside the config (the defaults generated when missing) go
    into the node folders and onto the nodes."""
    cluster = _load(path)
    locked = _lock(path, cluster, outdir) if update_lock else lock.read(path)
    cluster, locked = _pinned(path, cluster, locked, strict)
    found = _secrets(path, cluster) if with_secrets else None
    deployment = deploy.Deployment(
        cluster,
        _render(path, cluster, outdir, found=found),
        _progress,
        locked,
        lock.path_for(path),
        accept_drift=update_lock,
    )
    deployment.secret_files = found.files if found else {}
    return deployment


def _pinned(
    path: Path, cluster: config.Cluster, locked: lock.Lock | None, strict: bool
) -> tuple[config.Cluster, lock.Lock | None]:
    """The cluster with its base image named by the lock's ID, when there is a lock. `strict`:
    a config changed since its lock is an error."""
    if not locked:
        return cluster, None
    drift = lock.config_drift(cluster, locked) if strict else []
    if drift:
        raise errors.DriftError(drift, lock.path_for(path))
    return lock.pinned(cluster, locked), locked


def _secrets(path: Path, cluster: config.Cluster) -> secrets.Local:
    found = secrets.local(path, cluster)
    if "api_key" in found.generated:
        err.print(
            f"api key: generated {found.generated['api_key']} (mode 0600); clients send it as"
            " 'Authorization: Bearer <key>'",
            markup=False,
        )
    if "ray_token" in found.generated:
        err.print(
            f"ray token: generated {found.generated['ray_token']} (mode 0600); Ray's nodes"
            " authenticate with it",
            markup=False,
        )
    return found


def _lock(path: Path, cluster: config.Cluster, outdir: Path | None) -> lock.Lock:
    found = _secrets(path, cluster)
    deployment = deploy.Deployment(cluster, _render(path, cluster, outdir, found=found), _progress)
    deployment.secret_files = found.files
    resolved = deployment.resolve()
    written = lock.write(path, resolved)
    files = resolved["model"]["files"]
    size = sum(f["size"] for f in files.values())
    out.print(f"locked {written}: {cluster.image} = {resolved['image']['id']}")
    versions = ", ".join(f"{k} {v}" for k, v in sorted(resolved["versions"].items()) if v)
    out.print(f"  versions: {versions}")
    revision = resolved["model"]["revision"] or "none (not an HF cache snapshot)"
    out.print(f"  model: {len(files)} files, {size / 1e9:.2f} GB, revision {revision}")
    return resolved


@app.command()
def validate(path: ConfigArg) -> None:
    """Check a config; print the nodes and their roles."""
    c = _load(path)
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
    cluster, _ = _pinned(path, _load(path), lock.read(path), strict=True)
    found = secrets.local(path, cluster, generate=False) if dry_run else _secrets(path, cluster)
    for name, missing in (found.missing if dry_run else {}).items():
        out.print(f"would generate {missing} ({name}, mode 0600)", markup=False)
    _render(path, cluster, outdir, dry_run, quiet=False, found=found)


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
    deployment = _deployment(path, outdir, strict=True, update_lock=update_lock, with_secrets=True)
    timeouts = deploy.Timeouts(join=join_timeout, serve=serve_timeout)
    result = deployment.up(timeouts, checks=not skip_preflight, keep_on_failure=keep_on_failure)
    for node, what in result.images.items():
        out.print(f"image on {node}: {what}")
    out.print("phases: " + ", ".join(f"{name} {seconds:.1f}s" for name, seconds in result.phases))
    out.print(f"ready: {result.endpoint}", markup=False)
    if and_watch:
        policy = watching.Policy(interval, deadline, failures, max_recoveries, backoff)
        _watch(deployment, policy, timeouts)


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
    deployment = _deployment(path, outdir, strict=True, with_secrets=True)
    policy = watching.Policy(interval, deadline, failures, max_recoveries, backoff)
    _watch(deployment, policy, deploy.Timeouts())


def _watch(
    deployment: deploy.Deployment, policy: watching.Policy, timeouts: deploy.Timeouts
) -> None:
    def report(line: str) -> None:
        err.print(f"{time.strftime('%H:%M:%S')} {line}", markup=False)

    group = _Recreating(deployment, timeouts)
    report(
        f"watch: checking every {policy.interval:g} s (canary deadline {policy.deadline:g} s);"
        f" Ctrl-C stops watching and leaves the group as it is"
    )
    try:
        watching.watch(group, policy, report)
    except KeyboardInterrupt:
        report("watch: stopped; the group is left as it is")
        raise typer.Exit(130) from None


class _Recreating:
    """The deployment as watch sees it: recreate with the command's timeouts."""

    def __init__(self, deployment: deploy.Deployment, timeouts: deploy.Timeouts) -> None:
        self.deployment, self.timeouts = deployment, timeouts

    def problems(self, deadline: float) -> list[str]:
        return self.deployment.problems(deadline)

    def recreate(self) -> object:
        return self.deployment.recreate(self.timeouts)

    def down(self) -> dict[str, str]:
        return self.deployment.down()


@app.command("secrets")
def secrets_(path: ConfigArg, outdir: OutdirOpt = None) -> None:
    """Write the secret files (the API key, generated beside the config when missing, and the HF
    token) onto every node that needs them, as `up` does; for stacks started by hand."""
    deployment = _deployment(path, outdir, with_secrets=True)
    deployment.secrets_onto_nodes()
    for node in deployment.cluster.nodes:
        out.print(f"{node.name}: secrets written", markup=False)


@app.command("lock")
def lock_(path: ConfigArg, outdir: OutdirOpt = None) -> None:
    """Write CONFIG's lock beside it: the base image's ID, the versions inside it, the model's
    manifest (every file hashed on the head), the config's hash. render and up then use it."""
    _lock(path, _load(path), outdir)


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
    deployment = _deployment(path, outdir, strict=True)
    nodes = {n.name: n for n in deployment.cluster.nodes}
    if source is not None and source not in nodes:
        raise VllmComposeError(f"no node '{source}' in {path}", f"nodes: {', '.join(nodes)}")
    outcomes = deployment.sync_model(nodes[source] if source else deployment.cluster.head)
    for node, outcome in outcomes.items():
        what = outcome.error or f"{units.size(outcome.moved)} moved, {outcome.kept} files kept"
        out.print(f"{node}: {'FAILED: ' if outcome.error else ''}{what}", markup=False)
    failed = [node for node, outcome in outcomes.items() if outcome.error]
    if failed:
        raise VllmComposeError(
            f"sync-model: {len(failed)} of {len(outcomes)} nodes do not hold the model",
            "run sync-model again: files already correct are kept",
        )


@app.command()
def preflight(
    path: ConfigArg,
    outdir: OutdirOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Check every node before starting: contexts, interface and IP, reach between every pair,
    one image and the same versions, the model's files, /dev/shm, memlock, Ray settings, ports.
    Writes the secret files onto the nodes first, as up does: the checks run in the stack."""
    checks, seconds = _deployment(path, outdir, with_secrets=True).preflight()
    failures = [c for c in checks if c.status == "fail"]
    if as_json:
        out.print(preflight_checks.as_json(checks), markup=False)
    else:
        for check in checks:
            out.print(check.line(), markup=False)
        out.print(f"{len(checks)} checks in {seconds:.1f} s: {len(failures)} failed", markup=False)
    if failures:
        first = failures[0]
        raise VllmComposeError(
            f"preflight: {len(failures)} failed; first: {first.node}: {first.cause}"
        )


@app.command()
def down(path: ConfigArg, outdir: OutdirOpt = None) -> None:
    """Stop and remove the stack on every node, in parallel, volumes included."""
    outcome = _deployment(path, outdir).down()
    for node, what in outcome.items():
        out.print(f"{node}: {what}")
    failed = [node for node, what in outcome.items() if what != "removed"]
    if failed:
        raise DockerError(failed[0], f"not cleaned ({len(failed)} of {len(outcome)} nodes failed)")


@app.command()
def status(
    path: ConfigArg,
    outdir: OutdirOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Per node: its services and their health, and whether Ray sees the node at its IP."""
    rows = _deployment(path, outdir).status()
    if as_json:
        out.print(json.dumps(rows, indent=2), markup=False)
        return
    for row in rows:
        out.print(_status_line(row), markup=False)
        for s in row["services"]:
            health = f", {s['health']}" if s["health"] else ""
            out.print(f"  {s['service']}: {s['state']}{health}", markup=False)


def _status_line(row: dict[str, Any]) -> str:
    alive = row.get("ray_alive_at_ip")
    ray = (
        ""
        if alive is None
        else ", alive in Ray at its IP"
        if alive
        else ", NOT alive in Ray at its IP"
    )
    line = f"{row['node']} ({row['ip']}){ray}"
    return f"{line}: unreachable: {row['error']}" if "error" in row else line


@app.command()
def logs(
    path: ConfigArg,
    outdir: OutdirOpt = None,
    node: Annotated[str | None, typer.Option("--node", help="Only this node.")] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep following.")] = False,
) -> None:
    """Logs of every node's services, merged, each line prefixed by its node."""
    deployment = _deployment(path, outdir)
    names = [n.name for n in deployment.cluster.nodes]
    if node is not None and node not in names:
        raise VllmComposeError(f"no node '{node}' in {path}", f"nodes: {', '.join(names)}")
    for line in deployment.logs(node, follow):
        out.print(line, markup=False)


@app.command()
def schema(
    markdown: Annotated[
        bool, typer.Option("--markdown", help="The README's table instead.")
    ] = False,
) -> None:
    """Print the config's JSON schema (for editors)."""
    out.print(reference.markdown() if markdown else reference.schema(), end="", markup=False)


@app.command()
def version() -> None:
    """Print the version."""
    out.print(__version__)


def main() -> None:
    try:
        app()
    except VllmComposeError as e:
        for line in e.lines():
            err.print(line, markup=False)
        sys.exit(e.exit_code)
