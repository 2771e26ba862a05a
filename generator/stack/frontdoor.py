"""The front door's HAProxy configuration: one port in front of every model served on the nodes.

- Who: a client's bearer key is hashed (SHA-256) and looked up in the keys' map, hash -> name;
  only hashes are on the node. An unknown key gets 401 in OpenAI's error shape. Another door on
  the nodes is let in by its door key's hash in the peers' map (hash -> `door:CLUSTER`).
- Limits: per key name, requests per minute and requests at once (HAProxy's stick table; 429
  with Retry-After past them). The admin key (the config's API key) has none, nor another door
  (its own limits came first).
- Where: the request's `model` (its JSON body, buffered whole) picks the vLLM through the
  routes' map, which holds every cluster behind a front door on the cluster's nodes (each door's
  port serves them all; nodes/door.py writes it on every `up` and `down`): model -> the loopback
  port of its vLLM where its door is on this node, or -> HOST:PORT of its door on another node,
  asked with this door's key (the door there holds the request through its recoveries). An
  unknown model gets OpenAI's 404; `/v1/models` answers from the models' list file. A request
  naming no model goes to the door's own cluster.
- Held: a request that has had no byte of answer is sent again (L7 retries), a second apart,
  while its vLLM refuses connections, answers nothing or answers as a dead engine does, `hold`
  tries in all (stack/doorhold.py); then a 503 with Retry-After. HAProxy's own errors are in
  OpenAI's shape.
- Logged: a line a request (`option httplog`'s, then key name, model and the answer's tokens:
  a whole JSON answer's `usage`, or a stream's last event's, read by a Lua filter, when the
  request asked for it or, with `metrics`, when the door asked for it: stack/doorusage.py), to
  its output and, with `metrics`, to mtail, which counts them per key (stack/doorcounts.py).

HAProxy 2.6 (Debian 12's) is the oldest it is written for; every keyword here is in its manual
but what a `.if version_atleast` holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from generator.config import ports
from generator.stack import doorbalance, doorhold, doorusage
from generator.stack.doorerrors import ERRORS, TOO_MANY, UNAUTHORIZED, UNAVAILABLE
from generator.stack.doorfiles import ADMIN, FILES, LOCAL, PEER, Route
from generator.stack.monitoring import Sidecar

if TYPE_CHECKING:
    from generator.config import Cluster
    from generator.stack import NodeStack

BUFSIZE = 1 << 20  # a request up to 1 MiB is buffered whole: held, sent again and routed
# Freed buffers each thread keeps (3.0 on; the default keeps under one 1 MiB buffer): a burst of
# requests no longer goes to malloc for them (docs/front-door.md). Resident memory grows as much.
HOT_SIZE = 64 << 20
MAXCONN = 1000
RETRY_AFTER = 10  # seconds a client is told to wait after a held request's deadline
# Made, not read from a file of the user's; mounted like secrets, and read again on a reload (the
# routes and the model list are not secret, but are written on the node the same way).
KEYS = "/run/secrets/front_door_keys"  # hash -> key name, one per line
OPEN = ("/health", "/ping", "/version")  # answered without a key, as vLLM answers them
ROUTES = "/run/secrets/front_door_routes"  # model -> its vLLM's loopback port, or HOST:PORT
MODEL_LIST = "/run/secrets/front_door_models"  # what /v1/models answers
PEER_KEY = "/run/secrets/front_door_peer_key"  # `door KEY`: this door's key at the others
PEERS = "/run/secrets/front_door_peers"  # hash -> `door:CLUSTER`: every door on the nodes
LOG_FORMAT = (
    '"%ci:%cp [%tr] %ft %b/%s %TR/%Tw/%Tc/%Tr/%Ta %ST %B %CC %CS %tsc %ac/%fc/%bc/%sc/%rc'
    ' %sq/%bq %hr %hs %{+Q}r key=%{+Q}[var(txn.key)] model=\\"%[var(txn.model),json(ascii)]\\"'
    f' tokens=%[var({doorusage.PROMPT})]/%[var({doorusage.GENERATED})]"'
)
RUNTIME = "/var/run/haproxy.sock"  # the runtime API, inside the container only
CONFIG_FILE = "/etc/vllm-compose/front-door/haproxy.cfg"
CONFIG = "front-door-config"  # its Compose config


@dataclass(frozen=True)
class Limits:
    requests_per_minute: int  # 0: none
    concurrency: int  # requests at once per key; 0: none


def config(
    port: int,
    hold: int,
    own: Route,
    limits: Limits,
    counts: int | None = None,
    replicas: doorbalance.Replicas | None = None,
) -> str:
    """haproxy.cfg: the frontend on `port` (every address); the backend `models` sends a request
    to its model's vLLM (`own`, the door's own cluster's, when it names none), held through the
    inner proxy; `counts`: the loopback UDP port its log lines also go to (mtail's); `replicas`:
    the door's own model is shared between them (doorbalance.py)."""
    front = _frontend(port, own, limits, counted=counts is not None, balanced=bool(replicas))
    back = _backends(hold, own, replicas)
    held = doorhold.inner(LOCAL, RETRY_AFTER)
    if replicas:
        held += doorbalance.inner(replicas.addresses, RETRY_AFTER, PEER_KEY)
    return "\n".join([*_global(counts), *_defaults(), *front, *back, *held, ""])


def _global(counts: int | None) -> list[str]:
    lines = [
        "global",
        f"    maxconn {2 * MAXCONN}",  # a request held is two: the client's and its try's
        # One thread: with more, a thread drops its log line when another is writing one to the
        # output (HAProxy's DroppedLogs: 3 runs in 20 of two tests of tests/test_frontdoor.py),
        # and one forwards far more requests and tokens a second than a model answers.
        "    nbthread 1",
        f"    tune.bufsize {BUFSIZE}",
        *(".if version_atleast(3.0)", f"    tune.memory.hot-size {HOT_SIZE}", ".endif"),
        f"    stats socket {RUNTIME} mode 600 level admin expose-fd listeners",
        "    log stdout format raw local0 info",
        f"    lua-load {doorusage.FILE}",
        f"    lua-load {doorhold.FILE}",
    ]
    return lines + ([f"    log 127.0.0.1:{counts} format raw local0 info"] if counts else [])


def _defaults() -> list[str]:
    return [
        "defaults",
        "    mode http",
        "    option http-no-delay",  # a token is sent on when it comes, not batched (+180 ms)
        "    timeout connect 1s",
        "    timeout client 1h",  # a long generation, streamed or not
        "    timeout server 1h",
        "    timeout http-request 60s",
        "    timeout http-keep-alive 60s",
        f"    http-error status 503 content-type application/json string {UNAVAILABLE}"
        f" hdr Retry-After {RETRY_AFTER}",
        *(
            f"    http-error status {code} content-type application/json string {body}"
            for code, body in ERRORS.items()
        ),
    ]


def _frontend(port: int, own: Route, limits: Limits, counted: bool, balanced: bool) -> list[str]:
    lines = [
        "frontend api",
        f"    bind :{port}",
        f"    maxconn {MAXCONN}",
        *_logged(),
        "    option http-buffer-request",
        f"    filter lua.{doorusage.FILTER}",
        "    stick-table type string len 64 size 10k expire 2m store http_req_rate(1m),conn_cur",
        "    http-request set-var(txn.hash) req.hdr(authorization),word(2,' '),sha2(256),hex,lower",
        f"    http-request set-var(txn.key) var(txn.hash),map({KEYS})",
        f"    http-request set-var(txn.key) var(txn.hash),map({PEERS})"
        " unless { var(txn.key) -m found }",
        *_open(),
        "    http-request return status 401 content-type application/json string"
        f" {UNAUTHORIZED} if !{{ var(txn.key) -m found }} !{{ var(txn.open) -m bool }}",
        "    http-request track-sc0 var(txn.key)",
        "    http-request del-header Authorization",  # vLLM, on loopback, never sees a key
    ]
    if limits.requests_per_minute:
        lines.append(_too_many(f"sc_http_req_rate(0) gt {limits.requests_per_minute}", 60))
    if limits.concurrency:
        lines.append(_too_many(f"sc_conn_cur(0) gt {limits.concurrency}", 1))
    return [*lines, *_usage(), *_routed(own, counted, balanced)]


def _routed(own: Route, counted: bool, balanced: bool) -> list[str]:
    """Where a request goes: the model list, or its model's backend by the routes' map."""
    return [
        "    http-request return status 200 content-type application/json"
        f" file {MODEL_LIST} if {{ path /v1/models }} {{ method GET }}",
        "    http-request set-var(txn.model) req.body,json_query('$.model')",
        f"    http-request set-var({doorusage.ASKED})"
        " req.body,json_query('$.stream_options.include_usage')",
        *(_ask() if counted else []),
        f"    http-request set-var(txn.route) var(txn.model),hex,lower,map({ROUTES})",
        # A request naming no model goes to the door's own cluster, as vLLM takes it.
        f"    http-request set-var(txn.route) str({own.port}) unless {{ var(txn.model) -m found }}",
        "    use_backend health if { var(txn.open) -m bool }",
        *(
            [f"    use_backend {doorbalance.BACKEND} if {{ var(txn.route) -m str {own.port} }}"]
            if balanced
            else []
        ),
        "    use_backend doors if { var(txn.route) -m sub : }",
        "    use_backend models if { var(txn.route) -m found }",
        "    default_backend unknown",
    ]


def _logged() -> list[str]:
    """A line a request, this frontend's alone (the inner proxy's tries are not: doorhold.py):
    `option httplog`'s (method, path, status and times: no header, so no key), then the key's
    name and the model asked for: who asked what, for `logs`."""
    return [
        "    log global",
        f"    log-format {LOG_FORMAT}",
        "    option dontlognull",  # a connection that sent nothing (a port probe)
        "    unique-id-format %pid-%Ts-%rt",  # a request's, the same on each of its tries
    ]


def _open() -> list[str]:
    """What vLLM answers without a key, as load balancers and uptime checks ask it: its health,
    ping and version, passed on (backend `health`, not held: a health check wants the truth)."""
    return [
        f"    http-request set-var(txn.open) bool(true) if {{ path {' '.join(OPEN)} }}"
        " !{ method POST PUT DELETE PATCH }",
        "    http-request set-var(txn.open) bool(true) if { path /ping } { method POST }",
    ]


def _usage() -> list[str]:
    """The tokens of a whole JSON answer, from its `usage`, for the log line. Such an answer comes
    whole at its end, so waiting for its body (up to the buffer) delays nothing; a streamed one
    (text/event-stream) is passed on as it comes (doorusage.py reads its last event)."""
    return [
        "    acl whole res.hdr(content-type) -m beg application/json",
        "    http-response wait-for-body time 1s if whole",
        *(
            f"    http-response set-var({var}) res.body,json_query('$.usage.{field}') if whole"
            for var, field in doorusage.USAGE.items()  # as the Lua filter reads a stream's
        ),
    ]


def _ask() -> list[str]:
    """With `metrics`: a streamed completion that says nothing of `stream_options` is asked for
    its usage by the door (doorusage.py puts the question in its body, so the body is sent
    chunked, its length changed, and takes the answer's usage event out again)."""
    asking = f"if {{ var({doorusage.ASK}) -m bool }}"
    return [
        f"    http-request set-var({doorusage.ASK}) bool(true)"
        " if { path /v1/chat/completions /v1/completions }"
        " { req.body,json_query('$.stream') -m bool } !{ req.body -m sub stream_options }",
        f"    http-request del-header Content-Length {asking}",
        f"    http-request set-header Transfer-Encoding chunked {asking}",
    ]


def _too_many(condition: str, retry_after: int) -> str:
    return (
        f"    http-request return status 429 content-type application/json string {TOO_MANY}"
        f" hdr Retry-After {retry_after} if {{ {condition} }} !{{ var(txn.key) -m str {ADMIN} }}"
        f" !{{ var(txn.key) -m beg {PEER} }}"
    )


def _backends(hold: int, own: Route, replicas: doorbalance.Replicas | None) -> list[str]:
    if replicas:
        balanced = doorbalance.backend(len(replicas.addresses), hold, replicas.balance)
        health = doorbalance.health(len(replicas.addresses))
    else:
        balanced = []
        health = [f"    server vllm 127.0.0.1:{own.port}"]
    return [
        "backend unknown",
        "    http-request return status 404 content-type application/json lf-string"
        ' \'{"error":{"message":"The model %[var(txn.model),json(utf8s)] does not exist.",'
        '"type":"invalid_request_error","param":"model","code":"model_not_found"}}\'',
        "backend models",  # to the port its model's route names, on the loopback, held
        *doorhold.outer(hold),
        # To the door on another node its model's route names, as a door. That door holds the
        # request through its cluster's recoveries and says 503 past its hold: only a connection
        # that fails (that door starting again) is tried again here.
        "backend doors",
        f"    retries {hold}",  # a second apart
        "    retry-on conn-failure empty-response",
        f'    http-request set-header Authorization "Bearer %[str(door),map({PEER_KEY})]"',
        "    http-request set-dst var(txn.route),field(1,:)",
        "    http-request set-dst-port var(txn.route),field(2,:)",
        "    server door 0.0.0.0:0",
        *balanced,
        # The door's own cluster's vLLM, asked once: a refused connection is a 503 at once.
        "backend health",
        "    retries 0",
        "    timeout server 10s",
        *health,
    ]


def own(c: Cluster) -> Route:
    """The cluster's own model behind its front door (the routes' map on the node holds every
    cluster's there)."""
    return Route(c.served_model_name, ports.vllm(c))


def configs(c: Cluster) -> dict[str, str]:
    """Compose config name -> its content, for the head's stack."""
    door = c.front_door
    limits = Limits(door.requests_per_minute, door.concurrency)
    counts = ports.door_log(c) if c.metrics else None
    return {
        CONFIG: config(c.vllm.port, door.hold, own(c), limits, counts, doorbalance.of(c)),
        doorusage.CONFIG: doorusage.SCRIPT,
        doorhold.CONFIG: doorhold.SCRIPT,
    }


def sidecars(stack: NodeStack) -> list[Sidecar]:
    """The front door on the head, when it is on. As root: the keys' map is root's, mode 0600,
    as Compose mounts it from the node."""
    door = stack.cluster.front_door
    if not (door.enabled and stack.is_head):
        return []
    command = ["haproxy", "-W", "-db", "-f", CONFIG_FILE]
    files = [(CONFIG, CONFIG_FILE), (doorusage.CONFIG, doorusage.FILE),
             (doorhold.CONFIG, doorhold.FILE)]  # fmt: skip
    return [Sidecar("front-door", door.image, command, user="0", secrets=list(FILES),
                    configs=files)]  # fmt: skip
