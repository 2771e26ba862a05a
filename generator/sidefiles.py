"""The files the tool keeps beside a config (lock, history, stamps, logs, bench results) and the
config itself, as inputs: never read, written or shown through a link the tool did not make.

An input is checked before it is opened: a regular file (a link is refused, but for the config
itself, which is the user's to place), under a size limit, UTF-8; an error names the file and
never prints its contents.
"""

from __future__ import annotations

import stat
from pathlib import Path

from generator.errors import UnsafePath

LIMIT = 1 << 20  # bytes: a config, lock or history entry is a few KiB


def read(path: Path, limit: int = LIMIT, follow: bool = False) -> str:
    """The file's text. FileNotFoundError as from open(); anything else that is wrong with it
    raises UnsafePath (exit 2). `follow`: a link is followed (the config, the user's own)."""
    info = path.stat() if follow else path.lstat()
    if stat.S_ISLNK(info.st_mode):
        raise UnsafePath(f"{path} is a link; vllm-compose reads its own files only as they are",
                         f"remove the link (rm {path})")  # fmt: skip
    if not stat.S_ISREG(info.st_mode):
        raise UnsafePath(f"{path} is not a regular file", "move it away")
    if info.st_size > limit:
        raise UnsafePath(f"{path} holds {info.st_size} bytes, over {limit}", "move it away")
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise UnsafePath(f"{path} is not UTF-8 text", "move it away") from None


def folder(path: Path) -> Path:
    """`path` as a folder of the tool's own, made when missing; refused when it is a link."""
    if path.is_symlink():
        raise UnsafePath(f"{path} is a link; vllm-compose writes nothing through one",
                         f"remove the link (rm {path})")  # fmt: skip
    path.mkdir(parents=True, exist_ok=True)
    return path
