"""How the front door holds a request while its model's vLLM cannot answer it: a try a second.

HAProxy's L7 retries send a request again at once after an answer, and a second later only
after a refused connection. A vLLM whose engine died answers in a millisecond (its 500,
`EngineDeadError`) until its API server has stopped: a hold counted in tries was spent in that
window (seen: a plain request failed with 503 after 3.3 s of a Ray recovery, its 120 tries gone).
So the door's `models` backend sends each try through a second proxy of the same HAProxy, on a
Unix socket inside the door's container, which asks vLLM once:

- a try of a request it has seen (the request's unique id, in a stick table) waits a second
  first (a Lua action), so `front_door.hold` tries are as many seconds, whatever the answers;
- vLLM's own 500 of a dead engine becomes a 503, which the door tries again; any other 500 (an
  error of that request, `EngineGenerateError`) goes to the client at once, sent once;
- a refused connection is its 503, an empty answer its 502: both tried again.

The outer proxy logs and counts the request once; this one logs nothing.
"""

from __future__ import annotations

CONFIG = "front-door-hold"  # its Compose config: the Lua action
FILE = "/etc/vllm-compose/front-door/hold.lua"
SOCKET = "/var/run/haproxy-hold.sock"  # the inner proxy's, inside the door's container
PACE = "hold-pace"  # `http-request lua.hold-pace`
TRY = "X-Vllm-Compose-Try"  # the request's unique id, the same on each of its tries
ROUTE = "X-Vllm-Compose-Route"  # the loopback port of the model's vLLM
DEAD = "EngineCore encountered an issue"  # vLLM's EngineDeadError, in its 500's body
RETRY_ON = "conn-failure empty-response 502 503 504"

SCRIPT = f"""\
-- vllm-compose's front door: a request tried again waits a second first (doorhold.py).
core.register_action("{PACE}", {{"http-req"}}, function(txn)
  core.msleep(1000)
end, 0)
"""


def outer(hold: int) -> list[str]:
    """The `models` backend's lines: the request, its route and id in headers of ours (a
    client's of the same names replaced), tried `hold` + 1 times through the inner proxy."""
    return [
        f"    retries {hold}",
        f"    retry-on {RETRY_ON}",
        f"    http-request set-header {TRY} %[unique-id]",
        f"    http-request set-header {ROUTE} %[var(txn.route)]",
        f"    server hold unix@{SOCKET}",
    ]


def inner(local: str, retry_after: int) -> list[str]:
    """The inner proxy: each try paced, then sent to its route's vLLM on `local` once; a dead
    engine's 500 made a 503 with `Retry-After` (the client's, were it the last try)."""
    return [
        *paced("hold", SOCKET, "vllm"),
        "backend vllm",
        f"    http-request set-dst ipv4({local})",
        f"    http-request set-dst-port req.hdr({ROUTE})",
        *answered(retry_after),
        "    server vllm 0.0.0.0:0",
    ]


def paced(frontend: str, socket: str, backend: str) -> list[str]:
    """A frontend of the inner proxy on `socket`: a try of a request it has seen already (its
    id, in its own table) waits a second, then goes to `backend`."""
    return [
        f"frontend {frontend}",
        f"    bind unix@{socket} mode 600",
        "    stick-table type string len 64 size 10k expire 1m store http_req_cnt",
        f"    http-request track-sc0 req.hdr({TRY})",
        f"    http-request lua.{PACE} if {{ sc_http_req_cnt(0) gt 1 }}",
        f"    default_backend {backend}",
    ]


def answered(retry_after: int) -> list[str]:
    """An inner backend's lines before its server: asked once, our headers taken off, a dead
    engine's 500 made a 503."""
    return [
        "    retries 0",
        f"    http-request del-header {TRY}",
        f"    http-request del-header {ROUTE}",
        "    http-response wait-for-body time 1s if { status 500 }",
        f"    acl dead res.body -m sub {DEAD!r}",
        f"    http-response set-header Retry-After {retry_after} if {{ status 500 }} dead",
        "    http-response set-status 503 if { status 500 } dead",
    ]
