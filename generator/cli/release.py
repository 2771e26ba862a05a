"""Commands that change a serving group with a way back: upgrade and rollback."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from generator.cli.app import ConfigArg, OutdirOpt, app, out, progress, show
from generator.operations import upgrade as upgrading
from generator.operations import workflow
from generator.operations.deploy import Result


def _opener(outdir: Path | None) -> upgrading.Open:
    @contextlib.contextmanager
    def open_(path: Path, **how: Any) -> Iterator[workflow.Opened]:
        with workflow.opened(path, outdir, progress, **how) as opened:
            show(opened)
            yield opened

    return open_


def report(switched: upgrading.Switched) -> None:
    served(switched.result)
    out.print(f"downtime: {switched.downtime:.1f}s (old group stopped -> new group answered)")
    out.print(f"recorded: {switched.entry.folder}")


def served(*results: Result) -> None:
    """How the start went: each replica's (its phases named by it when there are several),
    then the endpoint, the first's: its front door's."""
    for i, result in enumerate(results):
        for node, what in result.images.items():
            out.print(f"image on {node}: {what}")
        which = f"replica {i + 1} " if len(results) > 1 else ""
        timed = ", ".join(f"{name} {seconds:.1f}s" for name, seconds in result.phases)
        out.print(f"{which}phases: {timed}")
    out.print(f"ready: {results[0].endpoint}")


@app.command()
def upgrade(
    path: ConfigArg,
    outdir: OutdirOpt = None,
    accept: Annotated[
        bool,
        typer.Option(
            "--accept-changed-answers", help="Keep the new group when its answers changed."
        ),
    ] = False,
) -> None:
    """Move the serving group to the changed config. Staged while the old group serves (re-lock,
    image on every node, secrets, preflight); then the old group stops and the new one starts
    behind its gate, the config's golden prompt and the answers `check` recorded (canary). If
    it fails, the stack that served before starts again by itself. Each stack that served is
    kept in CONFIG-STEM.state/history/."""
    report(upgrading.upgrade(path, _opener(outdir), accept_changed_answers=accept))


@app.command()
def rollback(path: ConfigArg, outdir: OutdirOpt = None) -> None:
    """Start the stack that served before the one that serves now (from CONFIG-STEM.state/history/),
    and put its lock back; the config file is left as it is."""
    report(upgrading.rollback(path, _opener(outdir)))
