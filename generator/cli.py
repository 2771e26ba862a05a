"""The command line. The only module that prints or exits; everything else raises."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from generator import __version__, config, output, reference, render
from generator.errors import VllmComposeError

app = typer.Typer(
    help="Render and run per-node Docker Compose stacks for one vLLM model across several nodes.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

ConfigArg = Annotated[Path, typer.Argument(help="The cluster config (YAML).", show_default=False)]


def _load(path: Path) -> config.Cluster:
    cluster = config.load(path)
    for warning in config.warnings(cluster):
        err.print(f"[yellow]warning:[/] {warning}", markup=True)
    return cluster


def default_outdir(cluster: config.Cluster) -> Path:
    return Path("compose") / cluster.name


@app.command()
def validate(path: ConfigArg) -> None:
    """Check a config; print the nodes and their roles."""
    cluster = _load(path)
    out.print(
        f"{path}: valid; backend {cluster.backend}, TP {cluster.tensor_parallel_size}"
        f" x PP {cluster.vllm.pipeline_parallel_size} over {cluster.gpu_total} GPUs"
    )
    for node in cluster.nodes:
        role = "head" if node == cluster.head else "worker"
        out.print(
            f"  {node.name}: {role}, {node.ip} on {cluster.interface_of(node)},"
            f" context {node.docker_context}"
        )


@app.command("render")
def render_cmd(
    path: ConfigArg,
    outdir: Annotated[
        Path | None, typer.Option("-o", "--output", help="Output folder [default: compose/NAME].")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show the plan and diffs only.")
    ] = False,
) -> None:
    """Render one compose folder per node."""
    cluster = _load(path)
    target = outdir or default_outdir(cluster)
    files = render.render(cluster, path.name)
    changes = output.plan(files, target)
    for change in changes:
        out.print(f"{'would ' if dry_run else ''}{change.action:>9}  {change.path}")
        if dry_run and change.action != "identical":
            out.print(change.diff(), end="", markup=False)
    for folder in output.stale(files, target):
        err.print(f"note: {folder} is not a node of {cluster.name} any more; left as it is")
    if not dry_run:
        output.apply(changes)


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
