"""The front door in front of replicas (config `replicas`), run by the real HAProxy on loopback
(Debian 12's, 2.6) in front of plain HTTP servers that say who reached them (test_frontdoor's):
how our configuration shares requests, follows health and moves a try off a lost replica. Real
vLLM replicas behind it are in the testbed tests."""

from __future__ import annotations

import collections
import contextlib
import http.server
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from generator.stack import doorbalance, doorcounts, doorfiles, frontdoor
from tests.support.door import runnable
from tests.test_frontdoor import (
    ADMIN_KEY,
    COUNTS,
    COUNTS_LOG,
    HAPROXY,
    KEY,
    MTAIL,
    PORT,
    Failing,
    Upstream,
    chat,
    counts,
    get,
    started,
)

# The second replica on another loopback address: a replica on another node, sent the API key.
REPLICAS = [("127.0.0.1", 31112), ("127.0.0.2", 31113)]
OWN = doorfiles.Route("tiny", REPLICAS[0][1])


def serving(index: int, handler: type[http.server.BaseHTTPRequestHandler] = Upstream) -> (
        http.server.ThreadingHTTPServer):  # fmt: skip
    server = http.server.ThreadingHTTPServer(REPLICAS[index], handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def stopped(server: http.server.ThreadingHTTPServer) -> None:
    server.shutdown()
    server.server_close()


@pytest.fixture
def door(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    """The door in front of REPLICAS; its param: the balance, or "counted" (least connections,
    its lines counted by the real mtail running our program, as with `metrics`)."""
    balance = getattr(request, "param", "leastconn")
    counted = balance == "counted"
    addresses = [f"{host}:{port}" for host, port in REPLICAS]
    replicas = doorbalance.Replicas(addresses, "leastconn" if counted else balance)
    log = COUNTS_LOG if counted else None
    text = frontdoor.config(PORT, 10, OWN, frontdoor.Limits(0, 0), log, replicas=replicas)
    keys = {"alice": KEY, doorfiles.ADMIN: ADMIN_KEY}
    config = runnable(tmp_path, text, keys, [OWN], upstream_key=ADMIN_KEY)
    checked = subprocess.run([HAPROXY, "-c", "-f", str(config)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "WARNING" not in checked.stderr, checked.stderr
    with contextlib.ExitStack() as running:
        if counted:
            (tmp_path / "progs").mkdir()
            (tmp_path / "progs" / "front-door.mtail").write_text(doorcounts.program(2))
            mtail = [MTAIL, *doorcounts.arguments(COUNTS_LOG, COUNTS, str(tmp_path / "progs"))]
            running.enter_context(started(mtail, COUNTS, tmp_path / "mtail.log"))
        running.enter_context(started([HAPROXY, "-db", "-f", str(config)], PORT, tmp_path / "log"))
        yield tmp_path / "log"


def healthy(count: int, seconds: float = 10) -> None:
    """Until the door's checks have `count` replicas up (each put back after two, a second
    apart)."""
    deadline = time.monotonic() + seconds
    seen: set[int] = set()
    while len(seen) < count:
        assert time.monotonic() < deadline, seen
        seen |= {chat("tiny")[1]["port"] for _ in range(4)}
        time.sleep(0.2)


def spread(requests: int, clients: int, **body: Any) -> collections.Counter[int]:
    """Which replica (its port) answered each of `requests`, sent `clients` at a time."""
    with ThreadPoolExecutor(clients) as pool:
        answers = list(pool.map(lambda _: chat("tiny", **body), range(requests)))
    assert [status for status, _, _ in answers] == [200] * requests
    return collections.Counter(said["port"] for _, said, _ in answers)


def test_requests_are_shared_between_the_replicas_and_the_far_one_gets_the_api_key(
    door: Path,
) -> None:
    servers = [serving(0), serving(1)]
    try:
        healthy(2)
        counted = spread(60, 6)
        assert all(18 <= counted[port] <= 42 for _, port in REPLICAS), counted
        keys = {chat("tiny")[1]["authorization"] for _ in range(8)}
        assert keys == {None, f"Bearer {ADMIN_KEY}"}  # the door's own on loopback gets none
    finally:
        for server in servers:
            stopped(server)


@pytest.mark.parametrize("door", ["counted"], indirect=True)
def test_with_metrics_each_replicas_requests_are_counted_by_status(door: Path) -> None:
    servers = [serving(0), serving(1)]
    try:
        healthy(2)
        spread(8, 1)
    finally:
        for server in servers:
            stopped(server)
    logged = collections.Counter(re.findall(r" api replicas/(replica-\d) ", door.read_text()))
    assert len(logged) == 2, logged
    deadline = time.monotonic() + 10
    while True:  # mtail reads the lines over UDP: until it counted them all
        found = counts(0)
        counted = {r: found.get(f'front_door_replica_requests_total{{code="200",replica="{r}"}}', 0)
                   for r in logged}  # fmt: skip
        requests = sum(v for k, v in found.items() if k.startswith("front_door_requests_total"))
        if counted == logged and sum(counted.values()) == requests:
            break  # every line, counted per replica as per key
        assert time.monotonic() < deadline, (found, logged)
        time.sleep(0.2)


@pytest.mark.parametrize("door", ["prefix"], indirect=True)
def test_with_prefix_balance_one_prompt_start_stays_on_one_replica(door: Path) -> None:
    servers = [serving(0), serving(1)]
    try:
        healthy(2)
        for n in range(6):
            prefix = {"messages": [{"role": "system", "content": f"agent {n} " + "x" * 300}]}
            assert len(spread(8, 1, **prefix)) == 1, n  # one at a time: under its bound
        starts = [{"messages": [{"role": "user", "content": f"{n} " * 200}]} for n in range(24)]
        landed = {next(iter(spread(1, 1, **start))) for start in starts}
        assert landed == {port for _, port in REPLICAS}  # different starts use both
    finally:
        for server in servers:
            stopped(server)


def test_a_lost_replica_costs_no_request_and_no_wait(door: Path) -> None:
    first, second = serving(0), serving(1)
    try:
        healthy(2)
        waits: list[float] = []

        def timed(_: int) -> int:
            began = time.monotonic()
            status = chat("tiny")[0]
            waits.append(time.monotonic() - began)
            return status

        with ThreadPoolExecutor(4) as pool:
            answers = pool.map(timed, range(400))
            time.sleep(0.2)
            stopped(second)  # refuses connections from now on
            statuses = list(answers)
        assert statuses == [200] * 400
        assert max(waits) < 1.0, max(waits)
        assert get("/health")[0] == 200  # one replica serves
    finally:
        stopped(first)


def test_a_dead_engines_500_moves_the_request_to_the_other_replica(door: Path) -> None:
    Failing.dead, Failing.sent = True, []
    first, second = serving(0), serving(1, Failing)
    try:
        healthy(1)
        began = time.monotonic()
        assert [chat("tiny")[0] for _ in range(10)] == [200] * 10
        assert time.monotonic() - began < 2
    finally:
        stopped(first)
        stopped(second)


def test_with_every_replica_gone_a_request_is_held_until_one_comes_back(door: Path) -> None:
    assert get("/health")[0] == 503  # none serves: the truth at once
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(chat, "tiny")
        time.sleep(1.5)
        server = serving(1)
        try:
            status, said, _ = answer.result(10)
        finally:
            stopped(server)
    assert status == 200 and said["port"] == REPLICAS[1][1]
