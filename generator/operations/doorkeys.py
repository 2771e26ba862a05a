"""`keys add|revoke`: the front door's keys changed in the state folder, then on the head: its keys'
map pushed and the front door reloaded, vLLM left as it is."""

from __future__ import annotations

import time
from pathlib import Path

from generator import config
from generator.base.errors import OptionError
from generator.base.fanout import Report
from generator.nodes import door
from generator.operations import workflow


def checked(path: Path, outdir: Path | None) -> None:
    """Before a key is made, shown, changed or listed: the config reads, its front door is on,
    and its output folder is one the tool may write (exit 2 otherwise, nothing changed)."""
    cluster = config.load(path)
    if not cluster.front_door.enabled:
        raise OptionError(
            f"keys: {path} has front_door.enabled: false; no front door takes keys",
            "remove that setting (the door is on by default), then vllm-compose up",
        )
    workflow.folder_for(cluster, outdir)


def pushed(path: Path, outdir: Path | None, report: Report) -> float | None:
    """The map on the head and the front door reloaded; seconds it took, or None when the front
    door does not run there (the next `up` brings the keys)."""
    start = time.monotonic()
    with workflow.opened(path, outdir, report, with_secrets=True) as opened:
        fleet = opened.fleet
        if not fleet.running(fleet.head, door.NAME):
            return None
        fleet.push_secrets([fleet.head])
        door.reload(fleet)
    return time.monotonic() - start
