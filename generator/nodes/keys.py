"""The front door's keys, one per user: made here, shown once, kept in the config's state folder
only as hashes (CONFIG-STEM.state/keys.json, mode 0600: name -> SHA-256 and when it was made). The
config's API key is the admin key and is no entry here."""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from generator.base import sidefiles
from generator.base.errors import OptionError, UnsafePath
from generator.stack.doorfiles import ADMIN, hashed
from generator.stack.output import write_atomic

NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")


@dataclass(frozen=True)
class Entry:
    sha256: str
    created: str  # ISO 8601, UTC


def path_for(config: Path) -> Path:
    return sidefiles.Beside(config).named("keys.json")


def read(config: Path) -> dict[str, Entry]:
    """name -> entry; none when the file is missing."""
    path = path_for(config)
    if not path.exists():
        return {}
    try:
        found = json.loads(sidefiles.read(path))
        return {name: Entry(**entry) for name, entry in found.items()}
    except (ValueError, TypeError, AttributeError):
        raise UnsafePath(
            f"{path} is not a keys file", "move it away; every key is then gone"
        ) from None


def add(config: Path, name: str) -> str:
    """A new key for `name`, kept as its hash; the key itself is returned to be shown once."""
    if not NAME.match(name) or name == ADMIN:
        raise OptionError(
            f"keys add {name!r}: not a key name",
            "lowercase letters, digits, '.', '_' or '-'; not 'admin'",
        )
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
    kept = read(config)
    if name not in kept:
        known = ", ".join(sorted(kept)) or "none"
        raise OptionError(f"keys revoke {name}: no key of that name", f"the keys: {known}")
    del kept[name]
    _write(config, kept)


def _write(config: Path, kept: dict[str, Entry]) -> None:
    text = json.dumps({n: asdict(e) for n, e in sorted(kept.items())}, indent=2) + "\n"
    write_atomic(sidefiles.ready(path_for(config)), text, 0o600)


def hashes(config: Path) -> dict[str, str]:
    """name -> SHA-256, for the front door's map."""
    return {name: entry.sha256 for name, entry in read(config).items()}
