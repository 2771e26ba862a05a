"""How much later a streamed token reaches its client through the front door than straight from
the server, side by side in one run on this machine's loopback, with its cores free and with
every core kept busy (as vLLM keeps a small machine's).

    python -m benchmarks.door_latency [--rounds N]

The stand-in for vLLM is benchmarks.door_stream's (an asyncio server, named as one: it measures
the door, not a model), in a process of its own as vLLM's server is: chat completion chunks
shaped as vLLM's, one event a millisecond, each event's text the time it was sent. The client
notes when each event arrives, straight from the stand-in and through HAProxy (the host's,
Debian's package) running the door's configuration as the tool renders it at its defaults, and
through two doors: another cluster's door (as on another node: it reaches this one at 127.0.0.2,
with its door key) in front of this one's, the way a model behind a door on another node is
reached. Every request asks for its usage, as `bench` and most agents' clients do (the usage
filter reads every event). Each round runs every way at 1 and at 8 streams at once, first with
the cores free, then with one busy loop per core (at the default priority, as a model's ranks run)
for that part alone. Printed: the median and the 99th percentile of an event's delay (sent to
received), each way, and what the door, or the two, add.

Traffic goes to 127.0.0.1 only; every loop is bounded (door_stream.EVENTS events a stream, 60 s
a batch, a process BUSY_FOR s at most); the processes it starts it ends, by their IDs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from benchmarks.door_arrivals import arguments, free_port, running, stand_in_process
from benchmarks.door_stream import KEY, MODEL, asked
from benchmarks.report import Figure, record
from generator.stack import doorfiles, frontdoor
from tests.support.door import runnable

AT_ONCE = (1, 8)  # streams at once
WAYS = ("direct", "door", "two doors")
DOOR_KEY = "the-other-doors-key"  # as doorfiles.peer_key makes one
BUSY_FOR = 600  # seconds a busy loop lives at most, were this benchmark ended before it
Delays = dict[str, list[float]]  # way -> every event's delay, in µs


async def delays(port: int) -> list[float]:
    """One streamed chat completion (asking for its usage); each token event's delay, in µs."""
    reader, writer = await asked(port, {"include_usage": True})
    found, pending = [], b""
    while chunk := await reader.read(65536):
        now = time.monotonic_ns()
        *events, pending = (pending + chunk).split(b"\n\n")
        for line in events:
            text = line[line.find(b"data: ") + 6 :]
            if b'"content":"' in text:
                sent = json.loads(text)["choices"][0]["delta"]["content"]
                found.append((now - int(sent)) / 1000)
    writer.close()
    return found


async def batch(port: int, streams: int) -> list[float]:
    got = await asyncio.wait_for(asyncio.gather(*(delays(port) for _ in range(streams))), 60)
    return [d for one in got for d in one]


@contextlib.contextmanager
def busy(cores: int) -> Iterator[None]:
    """One busy loop per core, each ending itself after BUSY_FOR s; ended by their IDs."""
    loop = f"import time\nend = time.monotonic() + {BUSY_FOR}\nwhile time.monotonic() < end: pass"
    started = [subprocess.Popen([sys.executable, "-c", loop]) for _ in range(cores)]
    try:
        time.sleep(0.5)  # they run
        yield
    finally:
        for process in started:
            process.terminate()
            process.wait(10)


async def measured(haproxy: str, count: int) -> dict[str, Delays]:
    """'free' / 'busy' -> 'WAY, N at once' -> every event's delay, over `count` rounds."""
    with stand_in_process("benchmarks.door_stream:stand_in", BUSY_FOR) as upstream:
        return await _measured(haproxy, count, upstream)


async def _measured(haproxy: str, count: int, upstream: int) -> dict[str, Delays]:
    route, none = doorfiles.Route(MODEL, upstream), frontdoor.Limits(0, 0)
    port, far = free_port(), free_port()
    hop = doorfiles.Route(MODEL, port, "127.0.0.2")  # the other door's route to this one's
    found: dict[str, Delays] = {"free": {}, "busy": {}}
    with tempfile.TemporaryDirectory(prefix="door-latency-") as tmp:
        near, other = Path(tmp, "door"), Path(tmp, "other")
        near.mkdir()
        other.mkdir()
        cfg = runnable(near, frontdoor.config(port, 120, route, none), {doorfiles.ADMIN: KEY},
                       [route], peers={"other": DOOR_KEY})  # fmt: skip
        far_cfg = runnable(other, frontdoor.config(far, 120, hop, none), {doorfiles.ADMIN: KEY},
                           [hop], peer_key=DOOR_KEY)  # fmt: skip
        with running(haproxy, cfg, port), running(haproxy, far_cfg, far):
            targets = dict(zip(WAYS, (upstream, port, far), strict=True))
            for target in targets.values():
                await delays(target)  # the first: its start, not counted
            for number in range(1, count + 1):
                print(f"round {number} of {count}", flush=True)
                for cores, kept in (("free", contextlib.nullcontext()), ("busy", busy(_cores()))):
                    with kept:
                        for streams in AT_ONCE:
                            for way, target in targets.items():
                                key = f"{way}, {streams} at once"
                                found[cores].setdefault(key, []).extend(
                                    await batch(target, streams)
                                )
    return found


def _cores() -> int:
    return len(os.sched_getaffinity(0))


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def main() -> None:
    haproxy, count = arguments("door_latency", __doc__.splitlines()[0])
    found = asyncio.run(measured(haproxy, count))
    print(f"\nan event's delay, sent to received ({count} rounds, {_cores()} cores):")
    figures = []
    for cores, ways in found.items():
        print(f"  cores {cores}" + (" (one busy loop each)" if cores == "busy" else ""))
        for streams in AT_ONCE:
            direct = ways[f"direct, {streams} at once"]
            for way in WAYS:
                values = ways[f"{way}, {streams} at once"]
                median, p99 = statistics.median(values), percentile(values, 0.99)
                extra = ""
                if way != "direct":
                    added = median - statistics.median(direct), p99 - percentile(direct, 0.99)
                    extra = f"  (median {added[0]:+.0f} us, p99 {added[1]:+.0f} us)"
                print(f"    {streams} at once, {way:9} median {median:7.0f} us, p99 {p99:7.0f} us"
                      f"{extra}")  # fmt: skip
                said = f"{median:,.0f} / {p99:,.0f} µs{extra.replace('us', 'µs')}"
                figures.append(Figure(f"cores {cores}, {streams} at once, {way}", said))
    about = ("A stand-in in its own process stamps each streamed event; the client notes its"
             " arrival, direct, through one door and through two (as a model behind a door on"
             " another node); 1 and 8 streams, with the cores free, then each kept busy by a loop;"
             f" {count} rounds.")  # fmt: skip
    record("Each token's delay through the door", about, "none: the door's delay a token", figures)


if __name__ == "__main__":
    main()
