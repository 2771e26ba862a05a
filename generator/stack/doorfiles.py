"""The front door's files on the node, beside its configuration (stack/frontdoor.py): who it lets
in and where it sends a model. Made here, written by nodes/secrets.py (as they start) and
nodes/door.py (every cluster's on the nodes, at each `up` and `down`), read again on a reload."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import re
from dataclasses import dataclass

ADMIN = "admin"  # the config's API key's name in the keys' map: no limits
# Every model and door on the nodes (route_files).
ROUTE_FILES = ("front_door_routes", "front_door_models", "front_door_peers")
FILES = ("front_door_keys", "front_door_peer_key", *ROUTE_FILES)
PEER = "door:"  # a door's name in the peers' map, before its cluster's (no key's name has ':')
LOCAL = "127.0.0.1"
HASH = re.compile(r"[0-9a-f]{64}")  # a key's SHA-256, as the maps hold it
CLUSTER = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")  # a cluster's name (config.sections.NAME)
KEY_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")  # a user's key's name (nodes/keys.py)


@dataclass(frozen=True)
class Route:
    model: str  # the served model name clients send
    port: int  # where that cluster's vLLM listens on the node's loopback, or its door's port
    host: str = LOCAL  # or the private IP of another node, where that cluster's door is

    @property
    def target(self) -> str:
        """Its value in the routes' map: the loopback port, or the other door's HOST:PORT."""
        return str(self.port) if self.host == LOCAL else f"{self.host}:{self.port}"


def routes_map(routes: list[Route]) -> str:
    """model -> port or HOST:PORT, one per line. The key is the model's name in hex (UTF-8): a
    name HAProxy's map format would split (a space), comment out (a leading '#') or end (a line
    break) is routed all the same; the door looks the request's model up as `hex,lower`."""
    return "".join(f"{key(r.model)} {r.target}\n" for r in _usable(routes))


def _usable(routes: list[Route]) -> list[Route]:
    """The routes a door may hold, by model: each read from a node's labels or files is checked
    here, once, against what the maps and the model list can carry."""
    kept = [r for r in routes if _model(key(r.model)) == r.model and _target(
        "" if r.host == LOCAL else r.host, str(r.port))]  # fmt: skip
    return sorted(kept, key=lambda r: r.model)


def key(model: str) -> str:
    """A model's key in the routes' map."""
    return model.encode("utf-8", "surrogatepass").hex()


def model_list(routes: list[Route]) -> str:
    """/v1/models' answer: every model behind the front door."""
    data = [{"id": r.model, "object": "model", "owned_by": "vllm"} for r in _usable(routes)]
    return json.dumps({"object": "list", "data": data}) + "\n"


def route_files(routes: list[Route], peers: dict[str, str]) -> dict[str, str]:
    """The routes' map, the model list and the peers' map (ROUTE_FILES), by name; `peers`:
    cluster -> the hash of its door's key."""
    files = [routes_map(routes), model_list(routes), peers_map(peers)]
    return dict(zip(ROUTE_FILES, files, strict=True))


def peer_key(api_key: bytes) -> str:
    """The key a door sends to the other doors on the nodes: made from its cluster's API key
    (HMAC-SHA256), so it changes with that key and shows nothing of it."""
    return hmac.new(api_key, b"vllm-compose front door", hashlib.sha256).hexdigest()


def peer_key_map(key: str, upstream: str | None = None) -> str:
    """The door's own key, as the map of one line the backend `doors` reads; with replicas, a
    line `vllm` more: the API key, which the replicas on other nodes want (stack/doorbalance)."""
    return f"door {key}\n" + (f"vllm {upstream}\n" if upstream else "")


def hashed(key: str | bytes) -> str:
    """A key as the doors hold it: its SHA-256, in hex."""
    return hashlib.sha256(key.encode() if isinstance(key, str) else key).hexdigest()


def peers_map(peers: dict[str, str]) -> str:
    """hash -> door:CLUSTER, one per line: each door on the nodes, let in as a door (a cluster's
    name or hash that is not of their shape is left out: no line of it reaches the map)."""
    kept = {c: h for c, h in peers.items() if CLUSTER.fullmatch(c) and HASH.fullmatch(h)}
    return "".join(f"{digest} {PEER}{cluster}\n" for cluster, digest in sorted(kept.items()))


def read_peers(text: str) -> dict[str, str]:
    """peers_map's lines back, as cluster -> hash (a line of another shape is skipped)."""
    found = {}
    for line in text.splitlines():
        digest, _, name = line.partition(" ")
        cluster = name.removeprefix(PEER)
        if name.startswith(PEER) and HASH.fullmatch(digest) and CLUSTER.fullmatch(cluster):
            found[cluster] = digest
    return found


def keys_map(hashes: dict[str, str]) -> str:
    """hash -> key name, one per line; a name or hash that could break a line of the map, or name
    a door, is refused (nodes/keys.py checks the keys file's own first)."""
    for name, digest in hashes.items():
        if not (KEY_NAME.fullmatch(name) and HASH.fullmatch(digest)):
            raise ValueError(f"not a key of the door's map: {name!r}")
    return "".join(f"{digest} {name}\n" for name, digest in sorted(hashes.items()))


def read_routes(text: str) -> list[Route]:
    """routes_map's lines back; a line of another shape is skipped: a key that is not a model
    name's hex, a target that is not a port or IPv4:PORT (read from a node, never trusted)."""
    found = []
    for line in text.splitlines():
        hexed, _, target = line.partition(" ")
        model = _model(hexed)
        host, _, port = target.rpartition(":")
        if model is not None and _target(host, port):
            found.append(Route(model, int(port), host or LOCAL))
    return found


def _model(hexed: str) -> str | None:
    """The model name a routes' map key holds; None when it holds none a route may name."""
    try:
        model = bytes.fromhex(hexed).decode("utf-8")
    except ValueError:
        return None
    printable = model.isprintable() or all(ch.isprintable() or ch == " " for ch in model)
    return model if 0 < len(model) <= 256 and printable else None


def _target(host: str, port: str) -> bool:
    if not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
        return False
    try:
        return not host or ipaddress.IPv4Address(host).version == 4
    except ValueError:
        return False


@dataclass(frozen=True)
class Known:
    """What a door knows of the other doors: its routes and its peers' map (cluster -> hash)."""

    routes: list[Route]
    peers: dict[str, str]


def merged(had: Known, seen: Known, looked_at: set[str], gone: str | None) -> Known:
    """A door's routes and peers once an `up` or `down` looked at the doors on its cluster's
    nodes (`looked_at`: their IPs) and `seen` what runs there: every route to those nodes (a
    loopback port, or a door at one of those IPs) is as seen; a route it had to a door on
    another node, learnt from another cluster's `up`, is kept. `gone`: the cluster whose `down`
    this is, let in no more."""
    models = {r.model for r in seen.routes}
    away = [r for r in had.routes if r.host != LOCAL and r.host not in looked_at]
    kept = [r for r in away if r.model not in models]
    peers = {c: h for c, h in had.peers.items() if c != gone} | seen.peers
    return Known(sorted([*kept, *seen.routes], key=lambda r: r.model), peers)
