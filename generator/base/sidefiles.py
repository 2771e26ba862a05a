"""The files the tool keeps for a config, and the config itself, as inputs: never read, written
or shown through a link the tool did not make.

Beside the config stay only what a user commits with it: the lock (CONFIG-STEM.lock.json) and the
golden answers (CONFIG-STEM.answers.json). Everything else (secrets, the door's files, keys,
history, logs, bench runs, model stamps) lives in one folder beside it, CONFIG-STEM.state/ (mode
0700, with a .gitignore that ignores all of it). `move_old` moves an earlier version's side files
there.

An input is checked before it is opened: a regular file (a link is refused, but for the config
itself, which is the user's to place), under a size limit, UTF-8; an error names the file and
never prints its contents.
"""

from __future__ import annotations

import json
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from generator.base.errors import BadFile, UnsafePath

LIMIT = 1 << 20  # bytes: a config, lock or history entry is a few KiB
STATE = "state"  # CONFIG-STEM.state/: the config's state folder
COMMITTED = ("lock.json", "answers.json")  # beside the config: meant to be committed with it
# What an earlier version kept beside the config as CONFIG-STEM.SUFFIX, now in the state folder.
OLD = (
    "api-key", "ray-token", "keys.json", "front-door-keys", "front-door-routes",
    "front-door-models.json", "front-door-peer-key", "front-door-peers", "history", "logs",
    "bench", "model-stamps.json",
)  # fmt: skip


class _Named:
    """A file or folder beside the config, named CONFIG-STEM.SUFFIX."""

    def __init__(self, suffix: str) -> None:
        self.suffix = suffix

    def __get__(self, beside: Beside, owner: type[Beside]) -> Path:
        return beside.named(self.suffix)


@dataclass(frozen=True)
class Beside:
    """Every file and folder the tool keeps for a config, named here only; the generated
    secrets' files (api-key, ray-token) and the door's are `named` by the secrets' module."""

    config: Path

    lock = _Named("lock.json")
    history = _Named("history")  # a folder: one entry per stack that served (history.py)
    stamps = _Named("model-stamps.json")
    logs = _Named("logs")  # a folder: the last start and the diagnostics bundles
    bench = _Named("bench")  # a folder: bench's runs
    answers = _Named("answers.json")  # the correctness gate's recorded answers

    @property
    def state(self) -> Path:
        return self.config.with_name(f"{self.config.stem}.{STATE}")

    def named(self, suffix: str) -> Path:
        if suffix in COMMITTED:
            return self.config.with_name(f"{self.config.stem}.{suffix}")
        return self.state / suffix

    def move_old(self, keep: set[Path]) -> tuple[list[str], list[str]]:
        """An earlier version's side files beside the config, moved into the state folder (a
        rename: a secret keeps its mode and is never copied); `keep`: files the config names
        itself, left where they are. Returns the names moved, and what was left and why."""
        moved: list[str] = []
        left: list[str] = []
        for suffix in OLD:
            old = self.config.with_name(f"{self.config.stem}.{suffix}")
            if (not old.is_symlink() and not old.exists()) or old.resolve() in keep:
                continue
            new = ready(self.state / suffix)
            if old.is_symlink() or not (old.is_file() or old.is_dir()):
                left.append(f"{old.name} (not a file or folder of its own)")
            elif new.exists() or new.is_symlink():
                left.append(f"{old.name} ({new} is there already)")
            else:
                old.rename(new)
                moved.append(old.name)
        return moved, left


def problem(path: Path, limit: int = LIMIT, follow: bool = False) -> str:
    """What keeps the file from being read ('' when nothing), from its metadata alone (a FIFO
    or a device is never opened). FileNotFoundError as from open()."""
    info = path.stat() if follow else path.lstat()
    if stat.S_ISLNK(info.st_mode):
        return "is a link; vllm-compose reads its own files only as they are"
    if not stat.S_ISREG(info.st_mode):
        return "is not a regular file"
    if info.st_size > limit:
        return f"is over {limit >> 20} MiB" if limit >= 1 << 20 else f"is over {limit} bytes"
    return ""


def read(path: Path, limit: int = LIMIT, follow: bool = False) -> str:
    """The file's text; UnsafePath (exit 2) naming what is wrong with it, never its contents.
    `follow`: a link is followed."""
    why = problem(path, limit, follow)
    if why:
        raise UnsafePath(f"{path} {why}", "move it away, or remove the link")
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise UnsafePath(f"{path} is not UTF-8 text", "move it away") from None


def read_json(path: Path, limit: int = LIMIT, what: str = "JSON") -> Any:
    """The file's JSON (read as `read` does); BadFile (exit 2) naming the file when it is not
    JSON, or nested too deep to read."""
    text = read(path, limit)
    try:
        return json.loads(text)
    except RecursionError:
        raise BadFile(f"{path}: nested too deep to be {what}", "move it away") from None
    except json.JSONDecodeError as e:
        raise BadFile(f"{path}: not {what} ({e.msg}, line {e.lineno})", "move it away") from None
    except ValueError:  # a number of over 4300 digits
        raise BadFile(f"{path}: not {what}", "move it away") from None


def shown(text: str, limit: int = 40) -> str:
    """A value a user gave, fit to be printed in one line: escaped (no control character reaches
    the terminal), cut at `limit` characters."""
    cut = text if len(text) <= limit else text[:limit] + "..."
    return repr(cut)


def not_a_link(path: Path) -> Path:
    """`path`, refused when it is a link: the tool writes nothing through one."""
    if path.is_symlink():
        raise UnsafePath(f"{path} is a link; vllm-compose writes nothing through one",
                         f"remove the link (rm {path})")  # fmt: skip
    return path


def ready(path: Path) -> Path:
    """`path`, to be written: its folder a config's state folder, that is made (mode 0700, with a
    .gitignore that ignores all of it) when missing; refused when it is a link."""
    state = path.parent
    if state.name.endswith(f".{STATE}"):
        not_a_link(state)
        if not state.exists():
            state.mkdir(mode=0o700)
            state.chmod(0o700)
            (state / ".gitignore").write_text("# vllm-compose's state: secrets, logs, runs\n*\n")
    return not_a_link(path)


def folder(path: Path) -> Path:
    """`path` as a folder of the tool's own, made when missing; refused when it is a link."""
    ready(path).mkdir(parents=True, exist_ok=True)
    return path
