"""Replicas' scaling behind the front door: N replicas of a STAND-IN for a GPU engine give N times
one replica's tokens a second at saturation, for N = 1 to 4.

    python -m benchmarks.replica_scaling [--rounds N]

Each replica is a stand-in in a process of its own that serves SLOTS sequences at once (as vLLM's
batch), the others waiting their turn, each streaming TOKENS events STEP apart after FIRST, sleeping
meanwhile (almost no CPU: the two cores are the door's and the clients'). HAProxy (the host's,
Debian's package, or `--haproxy PATH`) runs the front door's configuration as the tool renders it at
its defaults: for one replica, a group's; for several, the replicas' (leastconn). Per N and round,
CLIENTS_PER_SLOT x SLOTS x N clients (saturation: each replica with a queue) send their requests one
after another, REQUESTS_PER_CLIENT each; tokens/s is every token they got over the wall time.
Printed and recorded: the median over the rounds of tokens/s with N replicas / one replica's,
against the goal N x 0.9.

Traffic goes to 127.0.0.1 only; every loop is bounded in count and time; the processes it starts
it ends by their IDs.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.door_arrivals import arguments, free_port, named, running, stand_in_process
from benchmarks.door_cost import FIRST, STEP, TOKENS, answered, one
from benchmarks.door_stream import KEY, MODEL
from benchmarks.report import Figure, record
from generator.stack import doorbalance, doorfiles, frontdoor
from tests.support.door import runnable

SLOTS = 8  # sequences a replica serves at once
CLIENTS_PER_SLOT = 2  # clients per slot of every replica: each replica keeps a queue
REPLICAS = (1, 2, 3, 4)
REQUESTS_PER_CLIENT = 3
LIVES = 1800  # seconds a stand-in lives at most, were this benchmark ended before it
LIMIT = 120  # seconds one batch may take
GOAL = 0.9  # tokens/s with N replicas >= GOAL x N x one replica's

_slots: asyncio.Semaphore | None = None


async def stand_in(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """The STAND-IN for a GPU engine of SLOTS sequences: one streamed answer of TOKENS events
    once a slot is free, FIRST then STEP apart; a request without a body (a health check) is
    answered 200 at once."""
    global _slots
    _slots = _slots or asyncio.Semaphore(SLOTS)
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        lengths = [int(x.split(b":")[1]) for x in head.split(b"\r\n")
                   if x.lower().startswith(b"content-length:")]  # fmt: skip
        if not lengths:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            await writer.drain()
            writer.close()
            return
        await reader.readexactly(lengths[0])
    except asyncio.IncompleteReadError:  # a probe of the port
        writer.close()
        return
    async with _slots:
        await answered(writer)
    writer.close()


async def client(port: int) -> int:
    return sum([(await one(port))[1] for _ in range(REQUESTS_PER_CLIENT)])


async def saturated(port: int, replicas: int) -> float:
    """Tokens a second the door's clients got with `replicas` behind it, saturated."""
    clients = CLIENTS_PER_SLOT * SLOTS * replicas
    began = time.monotonic()
    got = await asyncio.wait_for(asyncio.gather(*(client(port) for _ in range(clients))), LIMIT)
    if sum(got) != clients * REQUESTS_PER_CLIENT * TOKENS:
        raise SystemExit(
            "replica_scaling: an answer came back short; the figures would mean nothing"
        )
    return sum(got) / (time.monotonic() - began)


def door(folder: Path, ports: list[int]) -> tuple[Path, int]:
    """The door's configuration for these replicas (a group's for one), runnable here."""
    route = doorfiles.Route(MODEL, ports[0])
    balanced = doorbalance.Replicas([f"127.0.0.1:{p}" for p in ports], "leastconn")
    port = free_port()
    text = frontdoor.config(port, 120, route, frontdoor.Limits(0, 0),
                            replicas=balanced if len(ports) > 1 else None)  # fmt: skip
    return runnable(folder, text, {doorfiles.ADMIN: KEY}, [route]), port


async def rounds(haproxy: str, count: int) -> dict[int, list[float]]:
    """N -> tokens/s per round."""
    found: dict[int, list[float]] = {n: [] for n in REPLICAS}
    with contextlib.ExitStack() as stack:
        ports = [stack.enter_context(stand_in_process("benchmarks.replica_scaling:stand_in",
                                                      LIVES, backlog=1024))
                 for _ in range(max(REPLICAS))]  # fmt: skip
        for n in range(count):
            print(f"round {n + 1} of {count}", flush=True)
            for replicas in REPLICAS:
                with tempfile.TemporaryDirectory(prefix="replica-scaling-") as tmp:
                    cfg, port = door(Path(tmp), ports[:replicas])
                    with running(haproxy, cfg, port):
                        await asyncio.sleep(3)  # the replicas' checks: two passed each
                        found[replicas].append(await saturated(port, replicas))
    return found


def main() -> None:
    haproxy, count = arguments("replica_scaling", __doc__.splitlines()[0])
    found = asyncio.run(rounds(haproxy, count))
    one_replica = statistics.median(found[1])
    print(f"\nreplicas behind the door, stand-ins of {SLOTS} slots streaming {TOKENS} tokens"
          f" {STEP * 1000:.0f} ms apart (median of {count} rounds):")  # fmt: skip
    figures = []
    for replicas, per_round in found.items():
        tps = statistics.median(per_round)
        ratio = tps / one_replica
        print(f"  {replicas} replica(s): {tps:.0f} tokens/s, {ratio:.2f}x one replica's")
        figures.append(Figure(f"tokens/s, {replicas} replica(s) / one", f"{tps:.0f} / "
                              f"{one_replica:.0f} = {ratio:.2f}x", f">= {GOAL * replicas:.1f}x",
                              ratio >= GOAL * replicas))  # fmt: skip
    about = (f"The door ({named(haproxy)}, the rendered configuration at defaults: leastconn)"
             f" in front of 1 to 4 stand-ins for a GPU engine of {SLOTS} sequences at once (a"
             f" first token after {FIRST * 1000:.0f} ms, then {TOKENS} tokens"
             f" {STEP * 1000:.0f} ms apart, almost no CPU), saturated by {CLIENTS_PER_SLOT}"
             f" clients per slot; {count} rounds.")  # fmt: skip
    record("Replicas' scaling", about, "N replicas >= 0.9 x N x one replica's tokens/s", figures)


if __name__ == "__main__":
    main()
