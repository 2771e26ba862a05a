"""How a supervised command is stopped (standard library only): on SIGTERM as a whole, or, when
its group broke, from the inside out, so that vLLM's API server answers what it holds.

A command runs in a session of its own (its process group). vLLM's API server is the command
itself; its engine and ranks are its children. Killed, they leave the API server to end every
request it holds with an error of its own: a stream gets an error event in OpenAI's shape, then
`[DONE]`, instead of a connection cut under way.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

STOP_GRACE = 20  # seconds the command has to stop on SIGTERM before it is killed
BREAK_GRACE = 5  # the same when the group broke, once its engine and ranks were killed
ENGINE_FIRST = 2  # seconds the command has to answer what it holds once its engine is gone


def stop(proc: subprocess.Popen[bytes], signum: int, grace: float = STOP_GRACE) -> None:
    """Signal the command's whole process group; kill it after `grace` seconds."""
    try:
        os.killpg(proc.pid, signum)
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        proc.wait()


def stop_broken(proc: subprocess.Popen[bytes]) -> None:
    """The group broke: its engine and ranks first (SIGKILL: a rank hung in a collective ignores
    SIGTERM), then, ENGINE_FIRST seconds later at most, the command."""
    for pid in members(proc.pid):
        if pid != proc.pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(ENGINE_FIRST)
    stop(proc, signal.SIGTERM, BREAK_GRACE)


def members(group: int) -> list[int]:
    """The processes of process group `group`, from /proc."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[2]) == group:
                found.append(int(stat.parent.name))
    return found
