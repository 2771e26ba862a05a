"""`ls`: every cluster on the nodes, whichever config started it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from generator import config
from generator.base.errors import ConfigError
from generator.cli.app import JsonOpt, app, err, out
from generator.nodes import survey


@app.command("ls")
def ls(
    path: Annotated[
        Path | None,
        typer.Argument(help="A config: look on its nodes' contexts.", show_default=False),
    ] = None,
    contexts: Annotated[
        list[str] | None, typer.Option("--context", "-c", help="A Docker context to look on.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Every cluster found on the nodes: its backend, endpoint, nodes (with replicas, each
    node's) and health."""
    where = list(contexts or [])
    if path is not None:
        where += [n.docker_context for n in config.load(path).nodes]
    if not where:
        raise ConfigError("ls", ["name a config or at least one --context"])
    found, failed = survey.clusters(where)
    for context, why in failed.items():
        err.print(f"ls: context '{context}' does not answer: {why}")
    if as_json:
        rows = [
            {"cluster": c.cluster, "backend": c.backend, "endpoint": c.endpoint,
             "front_door": c.front_door, "health": c.health, "nodes": c.nodes,
             "replicas": c.replicas}
            for c in found.values()
        ]  # fmt: skip
        out.print(json.dumps({"clusters": rows, "unreachable": failed}, indent=2))
        return
    table = Table("cluster", "backend", "endpoint", "nodes", "health", box=None)
    for c in found.values():
        endpoint = f"{c.endpoint} (front door)" if c.front_door else c.endpoint
        nodes = [f"{n} (replica {c.replicas[n]})" if n in c.replicas else n for n in c.nodes]
        table.add_row(c.cluster, c.backend, endpoint, ", ".join(nodes), c.health)
    out.print(table if found else "no cluster found")
