"""The front door's files on the node, beside its configuration (stack/frontdoor.py): who it lets
in and where it sends a model. Made here, written by nodes/secrets.py (as they start) and
nodes/door.py (every cluster's on the nodes, at each `up` and `down`), read again on a reload."""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass

ADMIN = "admin"  # the config's API key's name in the keys' map: no limits
# Every model and door on the nodes (route_files).
ROUTE_FILES = ("front_door_routes", "front_door_models", "front_door_peers")
FILES = ("front_door_keys", "front_door_peer_key", *ROUTE_FILES)
PEER = "door:"  # a door's name in the peers' map, before its cluster's (no key's name has ':')
LOCAL = "127.0.0.1"


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
    """model -> port or HOST:PORT, one per line (HAProxy's map format: the key ends at the first
    space, so a model name with a space cannot be routed; config rules refuse one)."""
    return "".join(f"{r.model} {r.target}\n" for r in sorted(routes, key=lambda r: r.model))


def model_list(routes: list[Route]) -> str:
    """/v1/models' answer: every model behind the front door."""
    data = [
        {"id": r.model, "object": "model", "owned_by": "vllm"}
        for r in sorted(routes, key=lambda r: r.model)
    ]
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


def peer_key_map(key: str) -> str:
    """The door's own key, as the map of one line the backend `doors` reads."""
    return f"door {key}\n"


def hashed(key: str | bytes) -> str:
    """A key as the doors hold it: its SHA-256, in hex."""
    return hashlib.sha256(key.encode() if isinstance(key, str) else key).hexdigest()


def peers_map(peers: dict[str, str]) -> str:
    """hash -> door:CLUSTER, one per line: each door on the nodes, let in as a door."""
    return "".join(f"{digest} {PEER}{cluster}\n" for cluster, digest in sorted(peers.items()))


def read_peers(text: str) -> dict[str, str]:
    """peers_map's lines back, as cluster -> hash (a line of another shape is skipped)."""
    found = {}
    for line in text.splitlines():
        digest, _, name = line.partition(" ")
        if name.startswith(PEER) and len(digest) == 64:
            found[name.removeprefix(PEER)] = digest
    return found


def keys_map(hashes: dict[str, str]) -> str:
    """hash -> key name, one per line."""
    return "".join(f"{digest} {name}\n" for name, digest in sorted(hashes.items()))


def read_routes(text: str) -> list[Route]:
    """routes_map's lines back (a line of another shape is skipped)."""
    found = []
    for line in text.splitlines():
        model, _, target = line.partition(" ")
        host, _, port = target.rpartition(":")
        if port.isdigit():
            found.append(Route(model, int(port), host or LOCAL))
    return found


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
