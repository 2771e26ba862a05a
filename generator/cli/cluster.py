"""Commands that run or look at the group on its nodes: up, watch, preflight, down, status, logs,
diagnose, top."""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
from typing import Annotated

import typer
from rich.live import Live
from rich.text import Text

from generator.base.errors import DockerError, OptionError, VllmComposeError
from generator.base.fanout import Report
from generator.cli.app import (
    DEFAULT,
    HOUR,
    POLICY_OPTIONS,
    ConfigArg,
    JsonOpt,
    OutdirOpt,
    UpdateLockOpt,
    app,
    err,
    open_config,
    out,
    with_policy,
)
from generator.cli.files import locked
from generator.cli.release import served
from generator.nodes import door, secrets
from generator.operations import checks as checking
from generator.operations import evidence, history, observe, workflow
from generator.operations import preflight as preflight_checks
from generator.operations import top as top_view
from generator.operations import watch as watching
from generator.operations.deploy import Deployment, Timeouts
from generator.stack import claims

SkipPreflightOpt = Annotated[
    bool, typer.Option("--skip-preflight", help="Start without the preflight checks.")
]
KeepOpt = Annotated[
    bool, typer.Option("--keep-on-failure", help="Leave a group that failed to start as it is.")
]
AndWatchOpt = Annotated[
    bool, typer.Option("--watch", help="Once ready, keep it serving as `watch` does.")
]


@app.command()
@with_policy
def up(
    ctx: typer.Context,
    path: ConfigArg,
    outdir: OutdirOpt = None,
    join_timeout: Annotated[
        int, typer.Option(min=1, max=24 * HOUR, help="Seconds for the workers to join Ray.")
    ] = 300,
    serve_timeout: Annotated[
        int | None,
        typer.Option(
            min=1, max=24 * HOUR, help="Seconds for serve's gate \\[default: vllm.startup_timeout]."
        ),
    ] = None,
    skip_preflight: SkipPreflightOpt = False,
    update_lock: UpdateLockOpt = False,
    keep_on_failure: KeepOpt = False,
    and_watch: AndWatchOpt = False,
    policy: watching.Policy = DEFAULT,
) -> None:
    """Render, preflight, then start every node over its context: head's Ray, workers' Ray,
    serve. A start phase that fails takes the group down again. With a lock beside the config,
    the locked image and model or an error."""
    given = [n for n in POLICY_OPTIONS if _given(ctx, n)]
    if given and not and_watch:
        flag = "--" + given[0].replace("_", "-")
        raise OptionError(f"up {flag}: it sets how watch runs, and up runs no watch without"
                          " --watch", f"add --watch, or leave {flag} out")  # fmt: skip
    timeouts = Timeouts(join=join_timeout, serve=serve_timeout)
    opened = open_config(
        path, outdir, strict=True, update_lock=update_lock, with_secrets=True, timeouts=timeouts
    )
    if update_lock and opened.locked:
        locked(opened.locked, path)
    # Replica by replica, the front door's first: each starts as one group does.
    results = [g.up(not skip_preflight, keep_on_failure) for g in opened.groups]
    history.record(path, opened.config_text, opened.locked)
    served(*results)
    if and_watch:
        _watch(opened, policy)


def _given(ctx: typer.Context, name: str) -> bool:
    """Was option `name` on the command line (not its default)?"""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name == "COMMANDLINE"


@app.command()
@with_policy
def watch(path: ConfigArg, outdir: OutdirOpt = None, policy: watching.Policy = DEFAULT) -> None:
    """Keep a started group serving: every INTERVAL s check every service on every node, Ray's
    nodes and a real completion; on failure recreate the whole group in order, with back-off;
    after MAX_RECOVERIES in a row take it down and stop, saying why. Ctrl-C leaves it as it is."""
    opened = open_config(path, outdir, strict=True, with_secrets=True)
    _watch(opened, policy)


def _watch(opened: workflow.Opened, policy: watching.Policy) -> None:
    def report(line: str) -> None:
        err.print(f"{time.strftime('%H:%M:%S')} {line}")

    report(
        f"watch: following every node's container events, checking every {policy.interval:g} s"
        f" (canary deadline {policy.deadline:g} s);"
        f" Ctrl-C stops watching and leaves the group as it is"
    )
    # Ctrl-C always stops watch: a process started with SIGINT ignored (a shell's background job,
    # some CI runners) inherits that, and Python then raises no KeyboardInterrupt at all.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    groups = opened.groups  # with replicas each is watched apart, as one group is
    try:
        for i, group in enumerate(groups[1:], start=2):
            said = _prefixed(report, f"replica {i}: ")
            threading.Thread(target=_watched, args=(group, policy, said), daemon=True).start()
        _watched(groups[0], policy, _prefixed(report, "replica 1: ") if groups[1:] else report)
    except KeyboardInterrupt:
        report("watch: stopped; the group is left as it is")
        raise typer.Exit(130) from None


def _watched(group: Deployment, policy: watching.Policy, report: Report) -> None:
    with group.following():
        watching.watch(group, policy, report)


def _prefixed(report: Report, prefix: str) -> Report:
    return lambda line: report(prefix + line)


@app.command()
def preflight(
    path: ConfigArg,
    outdir: OutdirOpt = None,
    as_json: JsonOpt = False,
    drop_caches: Annotated[
        bool,
        typer.Option(
            "--drop-caches",
            help="Drop each node's page cache first (on unified memory, CUDA does not count "
            "it as free). Never done unless asked.",
        ),
    ] = False,
) -> None:
    """Check every node before starting: contexts, interface and IP, reach between every pair,
    one image and the same versions, the model's files, /dev/shm, memlock, Ray settings, ports,
    GPUs, their heat and, on unified memory, whether the node's free memory holds the start.
    Writes the secret files onto the nodes first, as up does: the checks run in the stack."""
    opened = open_config(path, outdir, with_secrets=True)
    checks, seconds = preflight_checks.run(opened.fleet, opened.deployment.stamped, drop_caches)
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
    """Stop and remove the stack on every node, in parallel, volumes included. A cluster of
    the config's name started from another config file is left alone, and named."""
    fleet = open_config(path, outdir).fleet
    others = fleet.neighbours(fleet.cluster.nodes, stopped=True)
    claims.refuse_same_name(fleet.cluster.name, fleet.source, others)
    outcome = fleet.down()
    for node, what in outcome.items():
        out.print(f"{node}: {what}")
    if fleet.cluster.front_door.enabled:
        door.routed(fleet)  # the other doors on its head forget its model
    failed = [node for node, what in outcome.items() if what != "removed"]
    if failed:
        raise DockerError(failed[0], f"not cleaned ({len(failed)} of {len(outcome)} nodes failed)")


@app.command()
def status(path: ConfigArg, outdir: OutdirOpt = None, as_json: JsonOpt = False) -> None:
    """Per node: its services and their health, and whether Ray sees the node at its IP (its
    replica's Ray, with replicas)."""
    opened = open_config(path, outdir)
    rows = [row for g in opened.groups for row in observe.status(g.fleet)]
    if as_json:
        out.print(json.dumps([r.model_dump(exclude_unset=True) for r in rows], indent=2))
        return
    for row in rows:
        out.print(_status_line(row))
        for s in row.services:
            out.print(f"  {s.service}: {s.state}{f', {s.health}' if s.health else ''}")
        if not row.services and not row.error:
            out.print(f"  no containers of {path.name} (vllm-compose up starts them)")
    for line in observe.shares(opened.fleet) if opened.cluster.replicas > 1 else []:
        out.print(line)


def _status_line(row: observe.StatusRow) -> str:
    alive = row.ray_alive_at_ip
    ray = (
        ""
        if alive is None
        else ", alive in Ray at its IP"
        if alive
        else ", NOT alive in Ray at its IP"
    )
    of = f", replica {row.replica}" if row.replica else ""
    line = f"{row.node} ({row.ip}){of}{ray}"
    return f"{line}: unreachable: {row.error}" if row.error else line


@app.command()
def logs(
    path: ConfigArg,
    outdir: OutdirOpt = None,
    node: Annotated[str | None, typer.Option("--node", help="Only this node.")] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep following.")] = False,
) -> None:
    """Logs of every node's services, merged, each line prefixed by its node."""
    fleet = open_config(path, outdir).fleet
    names = [n.name for n in fleet.cluster.nodes]
    if node is not None and node not in names:
        raise VllmComposeError(f"no node '{node}' in {path}", f"nodes: {', '.join(names)}")
    for line in observe.logs(fleet, node, follow):
        out.print(line)


@app.command()
def diagnose(path: ConfigArg, outdir: OutdirOpt = None) -> None:
    """One bundle of what every node shows, to read or send: logs (exited containers too),
    containers' state and settings, compose files, which network NCCL used, the phases of the
    last start, preflight's checks and Ray's nodes (with replicas, each one's, and its state and
    share at the front door). Secrets read <redacted>. Prints its path."""
    opened = open_config(path, outdir)
    fleet = opened.fleet
    fleet.secret_files = secrets.local(path, opened.cluster, generate=False).files
    groups = [g.fleet for g in opened.groups]
    out.print(str(evidence.diagnose(fleet, opened.deployment.logs, groups)))


@app.command()
def top(
    path: ConfigArg,
    outdir: OutdirOpt = None,
    once: Annotated[bool, typer.Option("--once", help="One view, then exit.")] = False,
    as_json: JsonOpt = False,
    interval: Annotated[float, typer.Option(min=0.5, max=HOUR, help="Seconds between views.")] = 2,
) -> None:
    """A live view, one row per node: its containers and their health, CPU and memory, GPUs; and
    the endpoint's requests running and waiting, KV-cache use, prompt and generated tokens per
    second (with replicas, each one's too, and its state and share at the front door). Ctrl-C
    ends it. --once --json for scripts (the rates over one second)."""
    if as_json and not once:
        raise OptionError("top --json: the live view is for a terminal; --json goes with --once",
                          f"vllm-compose top {path} --once --json")  # fmt: skip
    opened = open_config(path, outdir)
    fleet, groups = opened.fleet, [g.fleet for g in opened.groups]
    _, before = top_view.sample(fleet, groups, None, 1)
    taken = time.monotonic()
    if once:
        time.sleep(1)
        view, _ = top_view.sample(fleet, groups, before, time.monotonic() - taken)
        out.print(view.model_dump_json(indent=2) if as_json else _table(view))
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with Live(console=out, auto_refresh=False) as live, contextlib.suppress(KeyboardInterrupt):
        while True:
            time.sleep(interval)
            view, before = top_view.sample(fleet, groups, before, time.monotonic() - taken)
            taken = time.monotonic()
            live.update(_table(view), refresh=True)


def _table(view: top_view.Top) -> Text:
    return Text("\n".join([time.strftime("%H:%M:%S"), *top_view.lines(view)]))
