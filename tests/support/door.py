"""The front door's HAProxy configuration, as the tool renders it, made runnable by the host's
haproxy: its files (keys' map, routes, model list, Lua filter, runtime socket) moved from their
places in the container into a folder of the caller's."""

from __future__ import annotations

from pathlib import Path

from generator.stack import doorbalance, doorfiles, doorhold, doorusage, frontdoor


def runnable(
    folder: Path,
    text: str,
    keys: dict[str, str],
    routes: list[doorfiles.Route],
    peers: dict[str, str] | None = None,
    peer_key: str = "",
    upstream_key: str | None = None,
) -> Path:
    """`text` (a rendered haproxy.cfg) written to `folder`, with its files beside it: `keys`,
    name -> key (hashed here, as on the node), `routes`, `peers` (cluster -> its door's key,
    hashed here), the door's own `peer_key` and the replicas' `upstream_key`. Returns the
    configuration's path."""
    hashes = {name: doorfiles.hashed(key) for name, key in keys.items()}
    files = {
        frontdoor.KEYS: doorfiles.keys_map(hashes),
        frontdoor.ROUTES: doorfiles.routes_map(routes),
        frontdoor.MODEL_LIST: doorfiles.model_list(routes),
        frontdoor.PEERS: doorfiles.peers_map(
            {name: doorfiles.hashed(key) for name, key in (peers or {}).items()}
        ),
        frontdoor.PEER_KEY: doorfiles.peer_key_map(peer_key or "no-door-key", upstream_key),
        frontdoor.RUNTIME: None,  # made by haproxy
        doorusage.FILE: doorusage.SCRIPT,
        doorhold.FILE: doorhold.SCRIPT,
        doorhold.SOCKET: None,  # made by haproxy
        **{doorbalance.socket(i): None for i in range(4)},
    }
    for path, content in files.items():
        local = folder / Path(path).name
        if content is not None:
            local.write_text(content)
        text = text.replace(path, str(local))
    config = folder / "haproxy.cfg"
    config.write_text(text)
    return config
