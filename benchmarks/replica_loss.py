"""A lost replica, from the clients' side: what it costs the requests that come while one of two
replicas behind the door is killed (SIGKILL) under load.

    python -m benchmarks.replica_loss [--rounds N]

Two STAND-INs for a GPU engine (benchmarks/replica_scaling.py's: SLOTS sequences at once, a first
token after FIRST, TOKENS tokens STEP apart, almost no CPU), each a process of its own, behind
HAProxy (the host's, or `--haproxy PATH`) running the front door's configuration for two replicas as
the tool renders it at its defaults. CLIENTS clients (fewer than one replica's slots: no queue forms
when one is gone, so a wait is the door's) each send streamed requests one after another; after
BEFORE seconds the second replica's process is killed, and the clients go on for AFTER seconds. Per
round: the requests sent after the kill that failed, the streams the kill cut (begun on the killed
replica: lost by nature), and the longest wait for a first token after the kill less the longest
before it. Goals: no request sent after the kill fails; the longest wait grows 2 s at most.

Traffic goes to 127.0.0.1 only; every loop is bounded in count and time; the processes it starts
it ends by their IDs.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from benchmarks.door_arrivals import arguments, free_port, named, running, wait_listening
from benchmarks.door_cost import TOKENS, one
from benchmarks.replica_scaling import LIVES, door
from benchmarks.report import Figure, record

CLIENTS = 6
BEFORE, AFTER = 5.0, 8.0  # seconds of load before the kill, and after it
SETTLE = 3.0  # seconds for the door's checks to pass both replicas at the start
GOAL_WAIT = 2.0  # seconds the longest wait for a first token may grow


@contextlib.contextmanager
def replica() -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    """A stand-in replica in a process of its own: (its port, the process), ended by its ID."""
    port = free_port()
    code = (
        "import asyncio\nfrom benchmarks.replica_scaling import stand_in\nasync def serve():\n"
        f"    await asyncio.start_server(stand_in, '127.0.0.1', {port}, backlog=1024)\n"
        f"    await asyncio.sleep({LIVES})\nasyncio.run(serve())"
    )
    process = subprocess.Popen([sys.executable, "-c", code])
    try:
        wait_listening(port, process)
        yield port, process
    finally:
        if process.poll() is None:
            process.terminate()
        process.wait(10)


async def streamed(port: int) -> tuple[float, float, bool]:
    """One streamed request: (sent at, seconds to its first token or to its failure, whole)."""
    sent = time.monotonic()
    try:
        first, tokens = await one(port)
    except OSError:  # refused, or broken off under way
        first, tokens = 0.0, 0
    return sent, first or time.monotonic() - sent, tokens == TOKENS


async def client(port: int, until: float) -> list[tuple[float, float, bool]]:
    done = []
    while time.monotonic() < until:
        done.append(await streamed(port))
    return done


async def one_round(haproxy: str) -> tuple[int, int, float]:
    """(requests sent after the kill that failed, streams cut by it, longest-wait growth s)."""
    with (
        replica() as (first, _),
        replica() as (second, victim),
        tempfile.TemporaryDirectory(prefix="replica-loss-") as tmp,
    ):
        cfg, port = door(Path(tmp), [first, second])
        with running(haproxy, cfg, port):
            await asyncio.sleep(SETTLE)
            until = time.monotonic() + BEFORE + AFTER
            load = asyncio.gather(*(client(port, until) for _ in range(CLIENTS)))
            await asyncio.sleep(BEFORE)
            victim.send_signal(signal.SIGKILL)
            killed = time.monotonic()
            done = [r for one in await asyncio.wait_for(load, BEFORE + AFTER + 60) for r in one]
    before = [wait for sent, wait, _ in done if sent < killed]
    after = [(wait, whole) for sent, wait, whole in done if sent >= killed]
    cut = sum(1 for sent, _, whole in done if sent < killed and not whole)
    failed = sum(1 for _, whole in after if not whole)
    return failed, cut, max(w for w, _ in after) - max(before)


def main() -> None:
    haproxy, count = arguments("replica_loss", __doc__.splitlines()[0])
    found = []
    for n in range(count):
        print(f"round {n + 1} of {count}", flush=True)
        found.append(asyncio.run(one_round(haproxy)))
    failed = sum(f for f, _, _ in found)
    cut = sum(c for _, c, _ in found)
    grew = statistics.median(g for _, _, g in found)
    worst = max(g for _, _, g in found)
    print(f"\none of two replicas killed under {CLIENTS} clients ({count} rounds): {failed}"
          f" request(s) sent after the kill failed, {cut} stream(s) under way on it cut; the"
          f" longest wait for a first token grew {grew:+.2f} s (median), {worst:+.2f} s at"
          " most")  # fmt: skip
    figures = [
        Figure("requests sent after the kill that failed", str(failed), "0", failed == 0),
        Figure("streams under way on the killed replica, cut", str(cut)),
        Figure("longest wait for a first token, growth (median / worst round)",
               f"{grew:+.2f} / {worst:+.2f} s", f"<= +{GOAL_WAIT:g} s", worst <= GOAL_WAIT),
    ]  # fmt: skip
    about = (
        f"Two stand-in replicas behind the door ({named(haproxy)}, the rendered"
        f" configuration at defaults); {CLIENTS} clients streaming; the second replica's"
        f" process killed after {BEFORE:g} s, {AFTER:g} s more of load; {count} rounds."
    )
    record("A lost replica", about, "no failed request sent after the kill; waits +2 s at most",
           figures)  # fmt: skip


if __name__ == "__main__":
    main()
