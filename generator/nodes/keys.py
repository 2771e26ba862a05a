"""The front door's keys, one per user: made here, shown once, kept in the config's state folder
only as hashes (CONFIG-STEM.state/keys.json, mode 0600: name -> SHA-256 and when it was made). The
config's API key is the admin key and is no entry here.

The file is read as untrusted: every name and hash is checked against what the door's map can
hold (one line each, no key named `admin` or `door:...`) before anything is written from it, and
a change is made under a lock, so two `keys add` at once lose neither key."""

from __future__ import annotations

import contextlib
import fcntl
import json
import secrets
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from generator.base import sidefiles
from generator.base.errors import BadFile, OptionError
from generator.stack.doorfiles import ADMIN, HASH, KEY_NAME, hashed
from generator.stack.output import write_atomic

NAME_HINT = "lowercase letters, digits, '.', '_' or '-', 64 at most; not 'admin'"


@dataclass(frozen=True)
class Entry:
    sha256: str
    created: str  # ISO 8601, UTC


def path_for(config: Path) -> Path:
    return sidefiles.Beside(config).named("keys.json")


def named(name: str) -> bool:
    """Whether the door's map can hold `name` as a user's key (KEY_NAME: no ':', a door's; no
    line break), the admin's name aside."""
    return bool(KEY_NAME.fullmatch(name)) and name != ADMIN


def checked(name: str) -> str:
    """`name`, refused (exit 2, shown escaped and cut) unless the door's map can hold it."""
    if not named(name):
        raise OptionError(f"keys: {sidefiles.shown(name)} is not a key name", NAME_HINT)
    return name


def read(config: Path) -> dict[str, Entry]:
    """name -> entry; none when the file is missing. BadFile (exit 2) naming the file and the
    entry when it is not the tool's: it is never trusted into the door's map."""
    path = path_for(config)
    if not path.exists() and not path.is_symlink():
        return {}
    found = sidefiles.read_json(path, what="a keys file")
    if not isinstance(found, dict):
        raise BadFile(f"{path}: not a keys file (a JSON object of name -> entry)", "move it away")
    return {_name(path, name): _entry(path, name, entry) for name, entry in found.items()}


def _name(path: Path, name: str) -> str:
    if not named(name):
        raise BadFile(f"{path}: key {sidefiles.shown(name)}: not a key name ({NAME_HINT})",
                      "remove that entry, or move the file away")  # fmt: skip
    return name


def _entry(path: Path, name: str, entry: object) -> Entry:
    fields = entry if isinstance(entry, dict) else {}
    digest, made = fields.get("sha256"), fields.get("created")
    if (
        set(fields) != {"sha256", "created"}
        or not isinstance(digest, str)
        or not HASH.fullmatch(digest)
        or not isinstance(made, str)
        or not _when(made)
    ):
        raise BadFile(
            f'{path}: key \'{name}\': an entry is {{"sha256": 64 hex digits, "created": an ISO'
            " time}",
            "remove that entry, or move the file away",
        )
    return Entry(digest, made)


def _when(text: str) -> bool:
    try:
        datetime.fromisoformat(text)
    except ValueError:
        return False
    return len(text) <= 40


def add(config: Path, name: str) -> str:
    """A new key for `name`, kept as its hash; the key itself is returned to be shown once."""
    checked(name)
    with _locked(config):
        kept = read(config)
        if name in kept:
            raise OptionError(
                f"keys add {name}: there is a key of that name", f"keys revoke {name} first"
            )
        key = "sk-" + secrets.token_urlsafe(32)
        made = datetime.now(UTC).isoformat(timespec="seconds")
        kept[name] = Entry(hashed(key), made)
        _write(config, kept)
    return key


def revoke(config: Path, name: str) -> None:
    checked(name)
    with _locked(config):
        kept = read(config)
        if name not in kept:
            known = ", ".join(sorted(kept)) or "none"
            raise OptionError(f"keys revoke {name}: no key of that name", f"the keys: {known}")
        del kept[name]
        _write(config, kept)


@contextlib.contextmanager
def _locked(config: Path) -> Iterator[None]:
    """The keys file held for one change (read, change, write) at a time."""
    lock = sidefiles.ready(path_for(config).with_name("keys.lock"))
    with lock.open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        yield


def _write(config: Path, kept: dict[str, Entry]) -> None:
    text = json.dumps({n: asdict(e) for n, e in sorted(kept.items())}, indent=2) + "\n"
    write_atomic(sidefiles.ready(path_for(config)), text, 0o600)


def hashes(config: Path) -> dict[str, str]:
    """name -> SHA-256, for the front door's map."""
    return {name: entry.sha256 for name, entry in read(config).items()}
