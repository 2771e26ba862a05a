"""The command line's shared parts: the Typer app, the two consoles (stdout for the command's
result, stderr for progress and errors), the options every command takes, opening a config, and
`main`, which turns every error into lines and an exit code. generator/cli is the only package
that prints or exits; everything else raises."""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from python_on_whales import DockerException
from rich.console import Console

from generator import config
from generator.base import sidefiles
from generator.base.errors import OptionError, VllmComposeError, reason
from generator.cli.live import Progress
from generator.nodes import secrets
from generator.operations import watch as watching
from generator.operations import workflow
from generator.stack import output

app = typer.Typer(
    help="Render and run per-node Docker Compose stacks for one vLLM model across several nodes.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
out = Console(highlight=False, soft_wrap=True, markup=False)
err = Console(stderr=True, highlight=False, soft_wrap=True, markup=False)


def state_moved(path: Path) -> Path:
    """An earlier version's side files beside the config moved into its state folder, said in one
    line; only for a config that loads (the command itself names what is wrong with one). A
    config whose file name is not UTF-8 is refused first: no file the tool writes could name it."""
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        raise OptionError(f"{sidefiles.shown(str(path), 80)}: the config's file name is not UTF-8",
                          "rename it") from None  # fmt: skip
    try:
        c = config.load(path)
    except (VllmComposeError, OSError):
        return path
    moved, left = sidefiles.Beside(path).move_old(secrets.named_files(path, c))
    state = sidefiles.Beside(path).state
    if moved:
        err.print(f"moved {len(moved)} side file(s) into {state}/: {', '.join(moved)}")
    for what in left:
        err.print(f"warning: left beside {path.name}: {what}; the tool now uses {state}/")
    return path


ConfigArg = Annotated[
    Path,
    typer.Argument(help="The cluster config (YAML).", show_default=False, callback=state_moved),
]
UpdateLockOpt = Annotated[
    bool, typer.Option("--update-lock", help="Re-lock from the head first, accepting drift.")
]
OutdirOpt = Annotated[
    Path | None, typer.Option("-o", "--output", help="Compose folders \\[default: compose/NAME].")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]


HOUR = 3600
IntervalOpt = Annotated[float, typer.Option(min=1, max=HOUR, help="watch: seconds between checks.")]
DeadlineOpt = Annotated[
    float,
    typer.Option(min=1, max=HOUR, help="watch: seconds the canary completion may take."),
]
FailuresOpt = Annotated[
    int, typer.Option(min=1, max=100, help="watch: failed checks in a row before a recovery.")
]
RecoveriesOpt = Annotated[
    int,
    typer.Option(
        min=0,
        max=100,
        help="watch: recoveries in a row before taking the group down and stopping.",
    ),
]
BackoffOpt = Annotated[
    float,
    typer.Option(
        min=0,
        max=HOUR,
        help="watch: seconds before a second recovery in a row (the first starts at once); "
        "doubles up to 300.",
    ),
]
HealOpt = Annotated[
    float,
    typer.Option(
        min=0,
        max=HOUR,
        help="watch: seconds a container that Docker starts again may take to serve again, "
        "with its group, before the group is recreated.",
    ),
]
DEFAULT = watching.Policy()
# watch's policy, as options of `watch` and of `up --watch` (declared once: with_policy).
POLICY_OPTIONS = {
    "interval": IntervalOpt,
    "deadline": DeadlineOpt,
    "failures": FailuresOpt,
    "max_recoveries": RecoveriesOpt,
    "backoff": BackoffOpt,
    "heal": HealOpt,
}


def with_policy(command: Callable[..., None]) -> Callable[..., None]:
    """`command` with watch's policy options added to its own; it gets them as one `policy`."""
    own = inspect.signature(command, eval_str=True)
    added = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=getattr(DEFAULT, name),
                          annotation=option)
        for name, option in POLICY_OPTIONS.items()
    ]  # fmt: skip
    params = [p for p in own.parameters.values() if p.name != "policy"] + added

    @functools.wraps(command)
    def run(**given: Any) -> None:
        chosen = {name: given.pop(name) for name in POLICY_OPTIONS}
        command(**given, policy=watching.Policy(**chosen))

    run.__signature__ = own.replace(parameters=params)  # type: ignore[attr-defined]
    run.__annotations__ = {p.name: p.annotation for p in params}
    return run


progress = Progress(err)


# What a command opened (a read-only command's temporary compose folder), closed by main().
_resources = contextlib.ExitStack()


def open_config(path: Path, outdir: Path | None, **how: Any) -> workflow.Opened:
    found = _resources.enter_context(workflow.opened(path, outdir, progress, **how))
    show(found)
    return found


def show(opened: workflow.Opened) -> None:
    """What opening the config did: warnings, generated secrets, files changed (on stderr:
    stdout stays the command's, `status --json`)."""
    for warning in config.warnings(opened.cluster):
        err.print(f"warning: {warning}")
    if opened.secrets:
        generated(opened.secrets)
    if opened.secrets is None:
        return  # rendered into a temporary folder
    for change in opened.plan.changes:
        if change.action != "identical":
            err.print(change_line(change, dry_run=False))
    for folder in opened.plan.stale:
        err.print(f"note: {folder} is not a node of {opened.cluster.name} any more; left as it is")


def generated(found: secrets.Local) -> None:
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
    listed = secrets.ignore(secrets.unignored(list(found.generated.values())))
    if listed:
        err.print(f"note: added the generated secret files to {listed}: never commit them")


def change_line(change: output.Change, dry_run: bool) -> str:
    secret = "  (secret: mode 0600, contents never shown)" if change.file.secret else ""
    return f"{'would ' if dry_run else ''}{change.action:>9}  {change.path}{secret}"


# One example per command, shown under its --help.
EXAMPLES = {
    "validate": "vllm-compose validate cluster.yaml",
    "render": "vllm-compose render cluster.yaml --dry-run",
    "secrets": "vllm-compose secrets cluster.yaml",
    "lock": "vllm-compose lock cluster.yaml",
    "sync-model": "vllm-compose sync-model cluster.yaml --from spark-1",
    "verify": "vllm-compose verify cluster.yaml",
    "schema": "vllm-compose schema > cluster.schema.json",
    "version": "vllm-compose version",
    "upgrade": "vllm-compose upgrade cluster.yaml",
    "rollback": "vllm-compose rollback cluster.yaml",
    "up": "vllm-compose up cluster.yaml --watch",
    "watch": "vllm-compose watch cluster.yaml",
    "preflight": "vllm-compose preflight cluster.yaml --json",
    "down": "vllm-compose down cluster.yaml",
    "status": "vllm-compose status cluster.yaml",
    "logs": "vllm-compose logs cluster.yaml --node spark-2 --follow",
    "diagnose": "vllm-compose diagnose cluster.yaml",
    "top": "vllm-compose top cluster.yaml --interval 2",
    "ls": "vllm-compose ls --context spark-1 --context spark-2",
    "bench": "vllm-compose bench cluster.yaml --concurrency 1 --concurrency 8 --repeat 3",
    "check": "vllm-compose check cluster.yaml",
}


def summarise(typer_app: typer.Typer) -> None:
    """Each command's line in `--help`: its docstring's first sentence on one line (Typer shows
    the docstring's hard line breaks there otherwise); its own `--help` keeps the whole text and
    ends with its example."""
    for command in typer_app.registered_commands:
        doc = command.help or (command.callback.__doc__ if command.callback else None) or ""
        text = " ".join(doc.split())
        end = text.find(". ")
        command.short_help = text if end < 0 else text[: end + 1]
        command.epilog = f"Example: {EXAMPLES[name(command)]}"


def name(command: typer.models.CommandInfo) -> str:
    """The command's name as typed: given, or its function's with dashes."""
    function = command.callback.__name__ if command.callback else ""
    return command.name or function.replace("_", "-")


def main() -> None:
    try:
        app()
    except VllmComposeError as e:
        progress.stop()
        for line in e.lines():
            err.print(line)
        sys.exit(e.exit_code)
    except DockerException as e:  # one that no layer named: still one line, never a traceback
        progress.stop()
        err.print(f"docker failed: {reason(e)}")
        sys.exit(1)
    finally:
        progress.stop()
        _resources.close()
