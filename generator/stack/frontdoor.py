"""The front door's HAProxy configuration: one port in front of every model served on the nodes.

- Who: a client's bearer key is hashed (SHA-256) and looked up in the keys' map, hash -> name;
  only hashes are on the node. An unknown key gets 401 in OpenAI's error shape.
- Limits: per key name, requests per minute and requests at once (HAProxy's stick table; 429
  with Retry-After past them). The admin key (the config's API key) has none.
- Where: the request's `model` (its JSON body, buffered whole) picks the backend through the
  models' map, model -> backend; an unknown model gets OpenAI's 404; `/v1/models` answers from
  the models' list file.
- Held: a request that has had no byte of answer is sent again (L7 retries, one second apart)
  while its backend is away or answers 5xx, for `hold` seconds; then a 503 with Retry-After.

HAProxy 2.6 (Debian 12's) is the oldest it is written for; every keyword here is in its manual.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from generator.config import ports
from generator.stack.monitoring import Sidecar

if TYPE_CHECKING:
    from generator.config import Cluster
    from generator.stack import NodeStack

ADMIN = "admin"  # the config's API key's name in the keys' map: no limits
BUFSIZE = 1 << 20  # a request up to 1 MiB is buffered whole: held, sent again and routed
MAXCONN = 1000
RETRY_AFTER = 10  # seconds a client is told to wait after a held request's deadline
KEYS = "/run/secrets/front_door_keys"  # hash -> key name, one per line
MODELS = "/etc/vllm-compose/front-door/models.map"  # model -> backend
MODEL_LIST = "/etc/vllm-compose/front-door/models.json"  # what /v1/models answers
RUNTIME = "/var/run/haproxy.sock"  # the runtime API, inside the container only
CONFIG_FILE = "/etc/vllm-compose/front-door/haproxy.cfg"
# Compose configs (name -> where the front door reads it).
CONFIGS = {"front-door-config": CONFIG_FILE, "front-door-models": MODELS,
           "front-door-model-list": MODEL_LIST}  # fmt: skip


@dataclass(frozen=True)
class Route:
    model: str  # the served model name clients send
    backend: str  # a name for HAProxy: letters, digits, '-', '_'
    address: str  # host:port of that cluster's vLLM


@dataclass(frozen=True)
class Limits:
    requests_per_minute: int  # 0: none
    concurrency: int  # requests at once per key; 0: none


def error(message: str, kind: str, code: str) -> str:
    """OpenAI's error body, as one HAProxy string argument (single-quoted, JSON inside)."""
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return "'" + json.dumps(body, separators=(",", ":")) + "'"


UNAUTHORIZED = error("Incorrect API key provided.", "invalid_request_error", "invalid_api_key")
TOO_MANY = error("Rate limit reached for this key.", "rate_limit_error", "rate_limit_exceeded")
UNAVAILABLE = error("The model is not serving now; try again.", "server_error", "unavailable")


def config(port: int, hold: int, routes: list[Route], limits: Limits) -> str:
    """haproxy.cfg: the frontend on `port` (every address), a backend per route; the first
    route is the door's own cluster."""
    return "\n".join(
        [
            *_global(),
            *_defaults(hold),
            *_frontend(port, limits, routes[0].backend),
            *_backends(routes),
            "",
        ]
    )


def _global() -> list[str]:
    return [
        "global",
        f"    maxconn {MAXCONN}",
        f"    tune.bufsize {BUFSIZE}",
        f"    stats socket {RUNTIME} mode 600 level admin expose-fd listeners",
        "    log stdout format raw local0 info",
    ]


def _defaults(hold: int) -> list[str]:
    return [
        "defaults",
        "    mode http",
        "    log global",
        "    option httplog",  # method, path, status and times: no header, so no key
        "    option http-no-delay",  # a token is sent on when it comes, not batched (+180 ms)
        "    timeout connect 1s",
        "    timeout client 1h",  # a long generation, streamed or not
        "    timeout server 1h",
        "    timeout http-request 60s",
        "    timeout http-keep-alive 60s",
        # One try a second (HAProxy waits min(timeout connect, 1 s) between tries).
        f"    retries {hold}",
        "    retry-on conn-failure empty-response 500 502 503 504",
        f"    http-error status 503 content-type application/json string {UNAVAILABLE}"
        f" hdr Retry-After {RETRY_AFTER}",
    ]


def _frontend(port: int, limits: Limits, own: str) -> list[str]:
    lines = [
        "frontend api",
        f"    bind :{port}",
        "    option http-buffer-request",
        "    stick-table type string len 64 size 10k expire 2m store http_req_rate(1m),conn_cur",
        "    http-request set-var(txn.key) req.hdr(authorization),word(2,' '),sha2(256),hex,lower,"
        f"map({KEYS})",
        "    http-request return status 401 content-type application/json string"
        f" {UNAUTHORIZED} unless {{ var(txn.key) -m found }}",
        "    http-request track-sc0 var(txn.key)",
        "    http-request del-header Authorization",  # vLLM, on loopback, never sees a key
    ]
    if limits.requests_per_minute:
        lines.append(_too_many(f"sc_http_req_rate(0) gt {limits.requests_per_minute}", 60))
    if limits.concurrency:
        lines.append(_too_many(f"sc_conn_cur(0) gt {limits.concurrency}", 1))
    lines += [
        "    http-request return status 200 content-type application/json"
        f" file {MODEL_LIST} if {{ path /v1/models }} {{ method GET }}",
        "    http-request set-var(txn.model) req.body,json_query('$.model')",
        # A request that names no model goes to the door's own cluster, as vLLM takes it.
        f"    use_backend %[var(txn.model),map({MODELS},unknown)] if {{ var(txn.model) -m found }}",
        f"    default_backend {own}",
    ]
    return lines


def _too_many(condition: str, retry_after: int) -> str:
    return (
        f"    http-request return status 429 content-type application/json string {TOO_MANY}"
        f" hdr Retry-After {retry_after} if {{ {condition} }} !{{ var(txn.key) -m str {ADMIN} }}"
    )


def _backends(routes: list[Route]) -> list[str]:
    lines = [
        "backend unknown",
        "    http-request return status 404 content-type application/json lf-string"
        ' \'{"error":{"message":"The model %[var(txn.model),json(utf8s)] does not exist.",'
        '"type":"invalid_request_error","param":"model","code":"model_not_found"}}\'',
    ]
    for route in routes:
        lines += [f"backend {route.backend}", f"    server vllm {route.address}"]
    return lines


def models_map(routes: list[Route]) -> str:
    """model -> backend, one per line (HAProxy's map format: the key ends at the first space,
    so a model name with a space cannot be routed; config rules refuse one)."""
    return "".join(f"{r.model} {r.backend}\n" for r in routes)


def model_list(routes: list[Route]) -> str:
    """/v1/models' answer: every model behind the front door."""
    data = [{"id": r.model, "object": "model", "owned_by": "vllm"} for r in routes]
    return json.dumps({"object": "list", "data": data}) + "\n"


def keys_map(hashes: dict[str, str]) -> str:
    """hash -> key name, one per line."""
    return "".join(f"{digest} {name}\n" for name, digest in sorted(hashes.items()))


def routes(c: Cluster) -> list[Route]:
    """The models behind this front door: the cluster's own."""
    return [Route(c.served_model_name, f"cluster-{c.name}", f"127.0.0.1:{ports.vllm(c)}")]


def configs(c: Cluster) -> dict[str, str]:
    """Compose config name -> its content, for the head's stack."""
    door, found = c.front_door, routes(c)
    limits = Limits(door.requests_per_minute, door.concurrency)
    texts = [config(c.vllm.port, door.hold, found, limits), models_map(found), model_list(found)]
    return dict(zip(CONFIGS, texts, strict=True))


def sidecars(stack: NodeStack) -> list[Sidecar]:
    """The front door on the head, when it is on. As root: the keys' map is root's, mode 0600,
    as Compose mounts it from the node."""
    door = stack.cluster.front_door
    if not (door.enabled and stack.is_head):
        return []
    command = ["haproxy", "-W", "-db", "-f", CONFIG_FILE]
    return [Sidecar("front-door", door.image, command, user="0", secrets=["front_door_keys"],
                    configs=list(CONFIGS.items()))]  # fmt: skip
