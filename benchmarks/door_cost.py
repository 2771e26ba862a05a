"""The front door's cost with many clients, where it can be resolved: in front of a STAND-IN for a
GPU engine that uses almost no CPU (a fixed wait before the first token, then a fixed step per
token, as a GPU's prefill and decode steps), door against direct, side by side in one run.

    python -m benchmarks.door_cost [--rounds N]

HAProxy (the host's, Debian's package, or `--haproxy PATH`) runs the front door's configuration as
the tool renders it at its defaults. The stand-in (an asyncio server in a process of its own)
answers each streamed chat completion with TOKENS events STEP apart after FIRST, shaped as vLLM's;
it sleeps between them, so the two cores are the door's and the clients'. Per concurrency (1, 16,
64, 256) and round, the two ways in turn (the order swapped each round): each client sends its
requests one after another, REQUESTS_PER_CLIENT of them; tokens/s is every token the clients got
over the wall time, TTFT each request's first token after its send. Printed and recorded: the median
over the rounds of tokens/s door / direct, and the door's TTFT p50 and p99 minus direct's.
Goals: >= 0.98x, p50 +2 ms at most, p99 +5 ms at most.

Traffic goes to 127.0.0.1 only; every loop is bounded in count and time; the processes it starts
it ends by their IDs.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.door_arrivals import arguments, free_port, named, running, stand_in_process
from benchmarks.door_stream import CHUNK, KEY, MODEL, asked, event
from benchmarks.report import Figure, record
from generator.stack import doorfiles, frontdoor
from tests.support.door import runnable

FIRST, STEP, TOKENS = 0.05, 0.02, 32  # seconds to the first token, between tokens; tokens each
CONCURRENCY = (1, 16, 64, 256)
REQUESTS_PER_CLIENT = 3
LIVES = 1800  # seconds the stand-in lives at most, were this benchmark ended before it
LIMIT = 120  # seconds one concurrency's batch may take
GOALS = (0.98, 2.0, 5.0)  # tokens/s ratio at least; TTFT p50 and p99 added, ms at most


async def stand_in(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """The STAND-IN for a GPU engine: one streamed answer of TOKENS events, FIRST then STEP
    apart, sleeping meanwhile (no CPU of its own to speak of)."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(x.split(b":")[1]) for x in head.split(b"\r\n")
                      if x.lower().startswith(b"content-length:"))  # fmt: skip
        await reader.readexactly(length)
    except (asyncio.IncompleteReadError, StopIteration):  # a probe of the port
        writer.close()
        return
    await answered(writer)
    writer.close()


async def answered(writer: asyncio.StreamWriter) -> None:
    """The stand-in's streamed answer: TOKENS events, FIRST then STEP apart, and [DONE]."""
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                 b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n")  # fmt: skip
    await asyncio.sleep(FIRST)
    for i in range(TOKENS):
        writer.write(event(CHUNK))
        await writer.drain()
        if i + 1 < TOKENS:
            await asyncio.sleep(STEP)
    writer.write(event("[DONE]") + b"0\r\n\r\n")
    await writer.drain()


async def one(port: int) -> tuple[float, int]:
    """One streamed chat completion: (seconds to its first token, tokens got)."""
    sent = time.monotonic()
    reader, writer = await asked(port, None)
    first, tokens = 0.0, 0
    while chunk := await reader.read(65536):
        found = chunk.count(b'"content"')
        if found and not tokens:
            first = time.monotonic() - sent
        tokens += found
    writer.close()
    return first, tokens


async def client(port: int) -> list[tuple[float, int]]:
    return [await one(port) for _ in range(REQUESTS_PER_CLIENT)]


async def batch(port: int, clients: int) -> tuple[float, list[float]]:
    """`clients` at once: (tokens a second, every request's TTFT in ms)."""
    began = time.monotonic()
    got = await asyncio.wait_for(asyncio.gather(*(client(port) for _ in range(clients))), LIMIT)
    took = time.monotonic() - began
    answers = [a for one in got for a in one]
    if any(tokens != TOKENS for _, tokens in answers):
        raise SystemExit("door_cost: an answer came back short; the figures would mean nothing")
    return sum(t for _, t in answers) / took, [first * 1000 for first, _ in answers]


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


async def rounds(haproxy: str, count: int) -> dict[int, list[tuple[float, float, float]]]:
    """concurrency -> per round (tokens/s ratio, TTFT p50 added, TTFT p99 added)."""
    found: dict[int, list[tuple[float, float, float]]] = {c: [] for c in CONCURRENCY}
    served = stand_in_process("benchmarks.door_cost:stand_in", LIVES, backlog=1024)
    with served as upstream, tempfile.TemporaryDirectory(prefix="door-cost-") as tmp:
        route = doorfiles.Route(MODEL, upstream)
        text = frontdoor.config(free_port(), 120, route, frontdoor.Limits(0, 0))
        port = int(text.split("bind :")[1].split()[0])
        cfg = runnable(Path(tmp), text, {doorfiles.ADMIN: KEY}, [route])
        with running(haproxy, cfg, port):
            for n in range(count):
                print(f"round {n + 1} of {count}", flush=True)
                for clients in CONCURRENCY:
                    ways = {}
                    for name in ("door", "direct") if n % 2 else ("direct", "door"):
                        ways[name] = await batch(port if name == "door" else upstream, clients)
                    (door_tps, door_ttft), (direct_tps, direct_ttft) = ways["door"], ways["direct"]
                    found[clients].append((
                        door_tps / direct_tps,
                        percentile(door_ttft, 0.5) - percentile(direct_ttft, 0.5),
                        percentile(door_ttft, 0.99) - percentile(direct_ttft, 0.99),
                    ))  # fmt: skip
    return found


def main() -> None:
    haproxy, count = arguments("door_cost", __doc__.splitlines()[0])
    found = asyncio.run(rounds(haproxy, count))
    print(f"\nthe door against direct, a stand-in streaming {TOKENS} tokens {STEP * 1000:.0f} ms"
          f" apart (median of {count} rounds):")  # fmt: skip
    figures = []
    for clients, per_round in found.items():
        ratio, p50, p99 = (statistics.median(r[i] for r in per_round) for i in range(3))
        each = ", ".join(f"{r[0]:.3f}" for r in per_round)
        print(f"  {clients:>3} clients: tokens/s {ratio:.3f}x direct ({each}), TTFT p50"
              f" {p50:+.1f} ms, p99 {p99:+.1f} ms")  # fmt: skip
        figures += [
            Figure(f"tokens/s door / direct, {clients} clients", f"{ratio:.3f}x ({each})",
                   f">= {GOALS[0]}x", ratio >= GOALS[0]),
            Figure(f"TTFT p50 / p99 added, {clients} clients", f"{p50:+.1f} / {p99:+.1f} ms",
                   f"<= +{GOALS[1]:g} / +{GOALS[2]:g} ms", p50 <= GOALS[1] and p99 <= GOALS[2]),
        ]  # fmt: skip
    about = (f"The door ({named(haproxy)}, the rendered configuration at defaults) against direct,"
             " in front of a stand-in for a GPU engine that uses almost no CPU: a first token"
             f" after {FIRST * 1000:.0f} ms, then {TOKENS} tokens {STEP * 1000:.0f} ms apart;"
             f" {REQUESTS_PER_CLIENT} streamed requests per client, side by side, {count}"
             " rounds.")  # fmt: skip
    goal = "tokens/s >= 0.98x direct; TTFT p50 +2 ms, p99 +5 ms at most"
    cores = os.cpu_count() or 1  # a machine of many cores: its figures kept apart
    title = "The door's cost with many clients" + (f" ({cores} cores)" if cores > 4 else "")
    record(title, about, goal, figures, variant="many-cores" if cores > 4 else "")


if __name__ == "__main__":
    main()
