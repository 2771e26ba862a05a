"""The stacks that served, newest last: CONFIG-STEM.state/history/ holds one folder
per good start (`up`, `upgrade`, `rollback`), each with the config's text and its lock as they
were. `upgrade` and `rollback` restore the stack of an entry from it."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from generator.base import sidefiles
from generator.base.errors import VllmComposeError
from generator.operations import lock
from generator.stack.output import write_atomic

KEEP = 20  # entries kept; the oldest go first
CONFIG = "config.yaml"
LOCK = "lock.json"


@dataclass(frozen=True)
class Entry:
    folder: Path

    @property
    def when(self) -> str:
        return self.folder.name

    @property
    def config_text(self) -> str:
        return sidefiles.read(self.folder / CONFIG)

    @property
    def locked(self) -> lock.Lock | None:
        path = self.folder / LOCK
        return lock.read_file(path) if path.exists() else None


def folder_for(config: Path) -> Path:
    return sidefiles.Beside(config).history


def entries(config: Path) -> list[Entry]:
    """Oldest first; an entry without its config (an interrupted record) is not one."""
    root = folder_for(config)
    if not root.is_dir():
        return []
    folders = [p for p in sorted(sidefiles.folder(root).iterdir()) if not p.is_symlink()]
    return [Entry(p) for p in folders if (p / CONFIG).is_file()]


def latest(config: Path) -> Entry | None:
    found = entries(config)
    return found[-1] if found else None


def record(config: Path, config_text: str, locked: lock.Lock | None) -> Entry:
    """A new entry for the stack that just served; unchanged from the latest, none is added."""
    last = latest(config)
    lock_text = lock.text(locked) if locked else ""
    if last and last.config_text == config_text and last.locked == locked:
        return last
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    folder = sidefiles.folder(folder_for(config)) / stamp
    folder.mkdir(exist_ok=False)
    if lock_text:
        write_atomic(folder / LOCK, lock_text)
    write_atomic(folder / CONFIG, config_text)  # last: its presence makes the entry
    for old in entries(config)[:-KEEP]:
        shutil.rmtree(old.folder, ignore_errors=True)
    return Entry(folder)


def before_latest(config: Path) -> Entry:
    """The entry `rollback` goes back to: the one before the stack that serves now."""
    found = entries(config)
    if len(found) < 2:
        raise VllmComposeError(
            f"{config}: no earlier stack to go back to ({len(found)} in {folder_for(config)})",
            hint="each `up`, `upgrade` and `rollback` that serves records its stack there",
        )
    return found[-2]
