"""The command line (Typer): `vllm-compose COMMAND`. The only package that prints or exits."""

from generator.cli import (  # noqa: F401 - each registers its commands
    cluster,
    files,
    keys,
    listing,
    measure,
    release,
)
from generator.cli.app import app, main, summarise

summarise(app)  # once every command is registered

__all__ = ["app", "main"]
