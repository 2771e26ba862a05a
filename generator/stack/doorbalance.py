"""How the front door shares one model between its replicas (config `replicas`), each a group of its
own: HAProxy's own balancing, its health checks and its redispatch; no router of ours.

The backend `replicas` picks a replica for each try (`front_door.balance`: least connections, or a
consistent hash of the request's first bytes with bounded load, for prefix affinity) among those
whose vLLM answers `GET /health` with 200 (asked every second, 5 s to answer; three failures in a
row take a replica out, two answers put it back: one slow answer under load, seen on the testbed,
must not). Meanwhile a lost replica costs a try a millisecond, not a wait: a try goes through the
inner proxy's frontend of its replica (doorhold.paced), which asks that replica's vLLM once: a
refused connection, an empty answer or a dead engine come back as 502 or 503, and the next try goes
at once to another replica (`option redispatch 1`: HAProxy leaves out the server the last try
failed on). A replica a request has tried already waits a second first, so that with every replica
gone the request is held as with one (`front_door.hold` seconds). While no replica passes its
check, the tries go to the door's own group through the holding proxy (the backup server), a second
apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from generator.config import ports
from generator.stack import doorhold
from generator.stack.doorfiles import LOCAL

if TYPE_CHECKING:
    from generator.config import Cluster

BACKEND = "replicas"
HASHED = 256  # bytes of the body the prefix hash reads: the model and the start of the prompt
LOAD_BOUND = 125  # % of the mean load a replica may take under `prefix` (hash-balance-factor)
UPSTREAM = "vllm"  # the line of the peer key's map holding the API key, for a replica's vLLM


@dataclass(frozen=True)
class Replicas:
    addresses: list[str]  # each replica's vLLM, the door's own first
    balance: str  # front_door.balance


def socket(index: int) -> str:
    """The inner proxy's socket for replica `index` (0-based), inside the door's container."""
    return f"/var/run/haproxy-replica-{index + 1}.sock"


def of(c: Cluster) -> Replicas | None:
    """The replicas behind the first one's door (None: one group). Each one's vLLM answers the
    door there: the door's own group on the loopback, the others at their head's private IP on
    `vllm.port` (with the API key)."""
    if c.replicas == 1:
        return None
    own = f"{LOCAL}:{ports.vllm(c)}"
    others = [f"{head.ip}:{c.vllm.port}" for head in c.replica_heads[1:]]
    return Replicas([own, *others], c.front_door.balance)


def backend(count: int, hold: int, balance: str) -> list[str]:
    """The backend `replicas`: `count` replicas, each tried through its paced frontend."""
    chosen = (
        ["    balance leastconn"]
        if balance == "leastconn"
        else [f"    balance hash req.body,bytes(0,{HASHED})", "    hash-type consistent",
              f"    hash-balance-factor {LOAD_BOUND}"]
    )  # fmt: skip
    return [
        f"backend {BACKEND}",
        *chosen,
        f"    retries {hold}",
        f"    retry-on {doorhold.RETRY_ON}",
        "    option redispatch 1",
        "    option httpchk GET /health",
        "    http-check expect status 200",
        "    timeout check 5s",
        f"    http-request set-header {doorhold.TRY} %[unique-id]",
        f"    http-request set-header {doorhold.ROUTE} %[var(txn.route)]",  # for the backup's
        *(f"    server replica-{i + 1} unix@{socket(i)} check inter 1s fall 3 rise 2"
          for i in range(count)),
        f"    server hold unix@{doorhold.SOCKET} backup",
    ]  # fmt: skip


def health(count: int) -> list[str]:
    """The backend `health`'s servers: the first replica whose check passes, asked once (none:
    HAProxy's 503 at once)."""
    return [
        "    balance first",
        *(f"    server replica-{i + 1} unix@{socket(i)} track {BACKEND}/replica-{i + 1}"
          for i in range(count)),
    ]  # fmt: skip


def inner(addresses: list[str], retry_after: int, peer_key: str) -> list[str]:
    """A paced frontend and a backend of one server for each replica; a replica on another node
    is sent the API key (from the peer key's map, line `vllm`), as its vLLM wants it."""
    lines = []
    for i, address in enumerate(addresses):
        name = f"replica-{i + 1}"
        lines += [*doorhold.paced(f"to-{name}", socket(i), name), f"backend {name}"]
        if not address.startswith(f"{LOCAL}:"):
            lines.append(f'    http-request set-header Authorization "Bearer'
                         f' %[str({UPSTREAM}),map({peer_key})]"')  # fmt: skip
        lines += [*doorhold.answered(retry_after), f"    server vllm {address}"]
    return lines
