"""`keys`: one key per user at the front door."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from python_on_whales import DockerException

from generator.base.errors import VllmComposeError, reason
from generator.cli.app import ConfigArg, OutdirOpt, app, err, out, progress
from generator.nodes import keys as store
from generator.operations import doorkeys

keys = typer.Typer(
    help="The front door's keys, one per user: add, revoke, ls.",
    epilog="Example: vllm-compose keys add cluster.yaml alice",
    no_args_is_help=True,
)
app.add_typer(keys, name="keys")
NameArg = Annotated[str, typer.Argument(help="Whose key: a name.", show_default=False)]


@keys.command("add", epilog="Example: vllm-compose keys add cluster.yaml alice")
def add(path: ConfigArg, name: NameArg, outdir: OutdirOpt = None) -> None:
    """Make a key for NAME, show it once, and let it in at the front door within seconds."""
    doorkeys.checked(path, outdir)
    key = store.add(path, name)
    out.print(key)
    _pushed(path, outdir, f"{name}'s key")


@keys.command("revoke", epilog="Example: vllm-compose keys revoke cluster.yaml alice")
def revoke(path: ConfigArg, name: NameArg, outdir: OutdirOpt = None) -> None:
    """Refuse NAME's key at the front door within seconds; the others stay valid."""
    doorkeys.checked(path, outdir)
    store.revoke(path, name)
    _pushed(path, outdir, f"{name}'s key revoked")


@keys.command("ls", epilog="Example: vllm-compose keys ls cluster.yaml")
def ls(path: ConfigArg) -> None:
    """The keys' names and when each was made (never a key)."""
    doorkeys.checked(path, None)
    kept = store.read(path)
    if not kept:
        out.print(f"no keys (only the admin key); add one: vllm-compose keys add {path} NAME")
        return
    width = max(len(name) for name in kept)
    out.print(f"{'NAME':<{width}}  MADE (UTC)")
    for name, entry in sorted(kept.items()):
        out.print(f"{name:<{width}}  {entry.created}")


def _pushed(path: Path, outdir: Path | None, what: str) -> None:
    kept = f"{what} is kept in the state folder; the next `up` brings it to the front door"
    try:
        took = doorkeys.pushed(path, outdir, progress)
    except DockerException as e:
        raise VllmComposeError(f"front door: not told: {reason(e)}", kept) from None
    except VllmComposeError as e:
        e.hint = f"{e.hint}; {kept}" if e.hint else kept
        raise
    if took is None:
        err.print(f"{what}: kept in the state folder; the front door gets it at the next `up`")
    else:
        err.print(f"{what}: at the front door ({took:.1f} s)")
