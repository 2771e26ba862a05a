"""The replicas as the front door sees them, through HAProxy's runtime API (its admin socket,
inside the door's container, asked with the image's Perl: Debian's images, the door's, all have
it): each replica's state and its share of the requests, and a replica drained (no new request;
those under way finish) and put back."""

from __future__ import annotations

import csv
import time
from dataclasses import dataclass

from python_on_whales import DockerException

from generator.base.errors import DockerError, reason
from generator.nodes import door
from generator.nodes.fleet import Fleet
from generator.stack import doorbalance, frontdoor

ASK = (  # one command to the runtime API, its answer printed
    "use IO::Socket::UNIX; my $s = IO::Socket::UNIX->new(Peer => $ARGV[0]) or die qq{$!\\n};"
    " print $s qq{$ARGV[1]\\n}; print while <$s>"
)
POLL = 1.0  # seconds between looks while a replica drains or comes back


@dataclass(frozen=True)
class Replica:
    name: str  # replica-N
    status: str  # HAProxy's: UP, DOWN, DRAIN, MAINT, UP 1/2 (rising) ...
    now: int  # requests under way
    total: int  # requests sent to it since the door started


def ask(fleet: Fleet, command: str) -> str:
    """One runtime API command to the door on the head; its answer."""
    try:
        said = fleet.execute(fleet.head, door.NAME, ["perl", "-e", ASK, frontdoor.RUNTIME, command])
    except DockerException as e:
        raise DockerError(fleet.head.name, f"the front door's runtime API: {reason(e)}") from None
    return said


def replicas(fleet: Fleet) -> list[Replica]:
    """Each replica as the door sees it, in order."""
    rows = csv.DictReader(ask(fleet, "show stat").removeprefix("# ").splitlines())
    return [
        Replica(row["svname"], row["status"], int(row["scur"] or 0), int(row["stot"] or 0))
        for row in rows
        if row["pxname"] == doorbalance.BACKEND and row["svname"].startswith("replica-")
    ]


def shares(fleet: Fleet) -> list[tuple[Replica, float]]:
    """Each replica as the door sees it, and its share (0 to 1) of the requests the door has sent
    to a replica since it started."""
    seen = replicas(fleet)
    total = sum(r.total for r in seen)
    return [(r, r.total / total if total else 0.0) for r in seen]


def drained(fleet: Fleet, index: int, timeout: float) -> int:
    """Replica `index` (0 on) takes no new request; returns once those under way have ended
    (progress said every few seconds), or after `timeout` s: how many are left then."""
    server = f"{doorbalance.BACKEND}/replica-{index + 1}"
    ask(fleet, f"set server {server} state drain")
    deadline, said = time.monotonic() + timeout, 0.0
    while (left := replicas(fleet)[index].now) and time.monotonic() < deadline:
        if time.monotonic() - said >= 5:
            fleet.report(f"drain: replica {index + 1}: {left} request(s) still under way")
            said = time.monotonic()
        time.sleep(POLL)
    return left


def ready(fleet: Fleet, index: int, timeout: float) -> bool:
    """Replica `index` back in the door's rotation; whether its checks passed within `timeout`."""
    ask(fleet, f"set server {doorbalance.BACKEND}/replica-{index + 1} state ready")
    deadline = time.monotonic() + timeout
    while replicas(fleet)[index].status != "UP":
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL)
    return True
