"""The front door's files in the config's state folder, beside the secrets (nodes/secrets.py): its
keys' map (made from the API key and the keys file), its own key at the other doors (made from
the API key), and its routes, model list and peers as it starts. Each is read back as the tool's
own before anything is made: a regular file, small, UTF-8, of its shape (exit 2, named)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from generator.base import sidefiles
from generator.base.errors import BadFile
from generator.config import Cluster
from generator.nodes import keys
from generator.stack import SECRET_NAMES, doorbalance, doorfiles, frontdoor
from generator.stack.output import write_atomic

DOOR_KEYS = "front_door_keys"  # made from the API key and the keys' file, not read from a file
PEER_KEY = "front_door_peer_key"  # made from the API key
LIMIT = 16 << 20  # bytes: a door's maps of every model and key on the nodes


@dataclass(frozen=True)
class Found:
    files: dict[str, Path]  # secret name -> its file (found, or made now)
    missing: dict[str, Path]  # secret name -> its file, not made (a dry run)


def made(
    config: Path, cluster: Cluster, files: dict[str, Path], missing: dict[str, Path], generate: bool
) -> None:
    """The door's files made (when `generate`) and listed into `files`, or `missing`."""
    found = Found(files, missing)
    _door_keys(config, found, generate, replicated=cluster.replicas > 1)
    _door_routes(config, cluster, found, generate)


def _path(config: Path, name: str) -> Path:
    return sidefiles.Beside(config).named(SECRET_NAMES[name])


def readable(config: Path) -> None:
    """The keys file and the door's files in the state folder, each refused (exit 2, named)
    unless the tool can read it as its own: a regular file, small, UTF-8, of its shape."""
    keys.read(config)
    for name in doorfiles.FILES:
        path = _path(config, name)
        if path.exists() or path.is_symlink():
            sidefiles.read(path, LIMIT)
    peer_hash({PEER_KEY: _path(config, PEER_KEY)})


def _door_keys(config: Path, found: Found, generate: bool, replicated: bool) -> None:
    """The front door's keys: SHA-256 hash -> name, the API key's as `admin`, written beside the
    config (mode 0600) when it changed; never a key itself. And its key at the other doors on
    the nodes (doorfiles.peer_key: made from the API key, as its only secret), with the API key
    itself when `replicated` (the replicas on other nodes want it)."""
    key = found.files.get("api_key")
    text = peer = None
    if key is not None and generate:
        api_key = key.read_bytes().rstrip(b"\n")
        digest = doorfiles.hashed(api_key)
        text = doorfiles.keys_map(keys.hashes(config) | {doorfiles.ADMIN: digest})
        upstream = api_key.decode() if replicated else None
        peer = doorfiles.peer_key_map(doorfiles.peer_key(api_key), upstream)
    _made(config, found, DOOR_KEYS, text)
    _made(config, found, PEER_KEY, peer)


def _door_routes(config: Path, cluster: Cluster, found: Found, generate: bool) -> None:
    """The front door's routes, model list and peers, as they start: its own cluster's model and
    door alone (nodes/door.py writes every cluster's on the nodes once the door runs)."""
    own = peer_hash(found.files)
    peers = {cluster.name: own} if own else {}
    for name, text in doorfiles.route_files([frontdoor.own(cluster)], peers).items():
        _made(config, found, name, text if generate else None)


def peer_hash(files: dict[str, Path]) -> str | None:
    """The hash of the door's key at the other doors (its line in their peers' maps), from its
    file in the state folder (`files`: the secrets found); None when there is none yet."""
    path = files.get(PEER_KEY)
    if path is None or not (path.exists() or path.is_symlink()):
        return None
    lines = sidefiles.read(path, LIMIT).splitlines()
    words = lines[0].split() if lines else []
    more = [line.split(" ")[0] for line in lines[1:]]
    if (
        len(words) != 2
        or words[0] != "door"
        or not doorfiles.HASH.fullmatch(words[1])
        or any(word != doorbalance.UPSTREAM for word in more)
    ):
        raise BadFile(f"{path}: not the door's key (door, then 64 hex digits; with replicas a"
                      " line vllm, then the API key)",
                      "remove it: the next command makes it again from the API key")  # fmt: skip
    return doorfiles.hashed(words[1])


def _made(config: Path, found: Found, name: str, text: str | None) -> None:
    """A made file in the state folder: written (mode 0600) when `text` is not what it holds
    (None: not made now), then listed as found, or as missing when there is none."""
    path = _path(config, name)
    had = sidefiles.read(path, LIMIT) if path.exists() or path.is_symlink() else None
    if text is not None and had != text:
        write_atomic(sidefiles.ready(path), text, 0o600)
    (found.files if path.exists() else found.missing)[name] = path
