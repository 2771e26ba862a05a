"""The command line (Typer): `vllm-compose COMMAND`. The only package that prints or exits."""

from generator.cli import (  # noqa: F401 - each registers its commands
    cluster,
    files,
    listing,
    measure,
    release,
)
from generator.cli.app import app, main

__all__ = ["app", "main"]
