"""The files the tool keeps beside a config (lock, history, stamps, logs, bench results) and the
config itself, as inputs: never read, written or shown through a link the tool did not make.

An input is checked before it is opened: a regular file (a link is refused, but for the config
itself, which is the user's to place), under a size limit, UTF-8; an error names the file and
never prints its contents.
"""

from __future__ import annotations

import stat
from dataclasses import dataclass
from pathlib import Path

from generator.base.errors import UnsafePath

LIMIT = 1 << 20  # bytes: a config, lock or history entry is a few KiB


class _Named:
    """A file or folder beside the config, named CONFIG-STEM.SUFFIX."""

    def __init__(self, suffix: str) -> None:
        self.suffix = suffix

    def __get__(self, beside: Beside, owner: type[Beside]) -> Path:
        return beside.named(self.suffix)


@dataclass(frozen=True)
class Beside:
    """Every file and folder the tool keeps beside a config, named here only; the generated
    secrets' files (.api-key, .ray-token) are `named` by the secrets' module."""

    config: Path

    lock = _Named("lock.json")
    history = _Named("history")  # a folder: one entry per stack that served (history.py)
    stamps = _Named("model-stamps.json")
    logs = _Named("logs")  # a folder: the last start and the diagnostics bundles
    bench = _Named("bench")  # a folder: bench's runs
    answers = _Named("answers.json")  # the correctness gate's recorded answers

    def named(self, suffix: str) -> Path:
        return self.config.with_name(f"{self.config.stem}.{suffix}")


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


def not_a_link(path: Path) -> Path:
    """`path`, refused when it is a link: the tool writes nothing through one."""
    if path.is_symlink():
        raise UnsafePath(f"{path} is a link; vllm-compose writes nothing through one",
                         f"remove the link (rm {path})")  # fmt: skip
    return path


def folder(path: Path) -> Path:
    """`path` as a folder of the tool's own, made when missing; refused when it is a link."""
    not_a_link(path).mkdir(parents=True, exist_ok=True)
    return path
