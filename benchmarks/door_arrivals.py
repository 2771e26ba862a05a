"""What the front door's HAProxy adds before a request reaches vLLM, and which of its settings
costs what, side by side in one run on this machine's loopback.

    python -m benchmarks.door_arrivals [--rounds N]

HAProxy (the host's, Debian's package, or `--haproxy PATH`) runs the front door's configuration as
the tool renders it at its defaults, and three variants of it: a 16 KiB buffer instead of 1 MiB,
retries on a refused connection only (no L7 retries), and no per-thread cache of freed buffers
(HAProxy 3.0 on; before 3.0 the same as the defaults). Behind it is a stand-in for vLLM (an asyncio
server here, which answers at once): it measures the door alone, not a model. Each round sends 16
requests at once (a chat completion's body, 2 KB), as `bench` does at concurrency 16, straight to
the stand-in and through each door, and notes when each whole request arrived there. Printed: per
endpoint, the median over the rounds of the median arrival, and its difference from direct.

Why: HAProxy keeps a copy of a request it may send again (its L7 retries, which hold requests
through a recovery), and the copy is of its whole buffer (`tune.bufsize`), not of the request.

Traffic goes to 127.0.0.1 only; every loop is bounded; the haproxy processes it starts it ends,
by their IDs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from benchmarks.report import Figure, record
from generator.stack import doorfiles, doorhold, frontdoor
from tests.support.door import runnable

AT_ONCE = 16
KEY = "bench-key"
BODY = json.dumps(
    {"model": "m", "stream": True, "messages": [{"role": "user", "content": "x" * 2000}]}
).encode()
VARIANTS = {  # name -> (what is replaced in the default configuration, by what)
    "the door (defaults)": ("", ""),
    "16 KiB buffer": (f"tune.bufsize {frontdoor.BUFSIZE}", "tune.bufsize 16384"),
    "no L7 retries": (f"retry-on {doorhold.RETRY_ON}", "retry-on conn-failure"),
    "no buffer cache (3.0 on)": (f"tune.memory.hot-size {frontdoor.HOT_SIZE}", ""),
}
DIRECT = "direct (the stand-in)"


class StandIn:
    """A stand-in for vLLM: notes when each whole request arrived, answers 200 at once."""

    def __init__(self) -> None:
        self.arrivals: list[float] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        await reader.readexactly(length)
        self.arrivals.append(time.monotonic())
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()


async def send(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: door\r\ncontent-type: application/json\r\n"
        b"authorization: Bearer %s\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s"
        % (KEY.encode(), len(BODY), BODY)
    )
    await writer.drain()
    await reader.read()
    writer.close()


async def median_arrival(stand_in: StandIn, port: int) -> float:
    """AT_ONCE requests sent together: the median of their arrivals, in ms after the send."""
    stand_in.arrivals.clear()
    sent = time.monotonic()
    await asyncio.wait_for(asyncio.gather(*(send(port) for _ in range(AT_ONCE))), 30)
    return statistics.median(a - sent for a in stand_in.arrivals) * 1000


def configuration(folder: Path, port: int, upstream: int, variant: tuple[str, str]) -> Path:
    """The door's haproxy.cfg as the tool renders it, the variant's change made, runnable here."""
    route = doorfiles.Route("m", upstream)
    text = frontdoor.config(port, 120, route, frontdoor.Limits(0, 0))
    old, new = variant
    if old not in text:
        raise SystemExit(f"door_arrivals: {old!r} is no longer in the door's configuration")
    changed = text.replace(old, new) if old else text
    return runnable(folder, changed, {doorfiles.ADMIN: KEY}, [route])


@contextlib.contextmanager
def door(haproxy: str, variant: tuple[str, str], upstream: int) -> Iterator[int]:
    """One haproxy on a free port, as the variant has it; ended by its ID."""
    with tempfile.TemporaryDirectory(prefix="door-arrivals-") as tmp:
        port = free_port()
        cfg = configuration(Path(tmp), port, upstream, variant)
        with running(haproxy, cfg, port):
            yield port


@contextlib.contextmanager
def running(haproxy: str, cfg: Path, port: int) -> Iterator[int]:
    """haproxy on `cfg`, once it listens on `port`: its ID (its master's); ended by it."""
    quiet = subprocess.DEVNULL
    process = subprocess.Popen([haproxy, "-W", "-db", "-f", str(cfg)], stdout=quiet, stderr=quiet)
    try:
        wait_listening(port, process)
        yield process.pid
    finally:
        process.terminate()
        process.wait(10)


@contextlib.contextmanager
def stand_in_process(handler: str, lives: float, backlog: int = 100) -> Iterator[int]:
    """A stand-in's handler (`MODULE:NAME`, an asyncio connection handler) serving in a process
    of its own (a token crosses from one process to another, as from vLLM's to its client's),
    living `lives` s at most: its port; ended by its ID."""
    module, name = handler.split(":")
    port = free_port()
    code = (
        f"import asyncio\nfrom {module} import {name}\nasync def serve():\n"
        f"    await asyncio.start_server({name}, '127.0.0.1', {port}, backlog={backlog})\n"
        f"    await asyncio.sleep({lives})\nasyncio.run(serve())"
    )
    process = subprocess.Popen([sys.executable, "-c", code])
    try:
        wait_listening(port, process)
        yield port
    finally:
        process.terminate()
        process.wait(10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_listening(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"door_arrivals: haproxy exited ({process.returncode})")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.05)
    raise SystemExit("door_arrivals: haproxy did not listen within 10 s")


async def rounds(haproxy: str, count: int) -> dict[str, list[float]]:
    stand_in = StandIn()
    server = await asyncio.start_server(stand_in.handle, "127.0.0.1", 0)
    upstream = int(server.sockets[0].getsockname()[1])
    found: dict[str, list[float]] = {DIRECT: [], **{name: [] for name in VARIANTS}}
    for number in range(1, count + 1):
        print(f"round {number} of {count}", flush=True)
        found[DIRECT].append(await median_arrival(stand_in, upstream))
        for name, variant in VARIANTS.items():
            with door(haproxy, variant, upstream) as port:
                await median_arrival(stand_in, port)  # the first: its connections, not counted
                found[name].append(await median_arrival(stand_in, port))
    server.close()
    return found


def arguments(name: str, doc: str) -> tuple[str, int]:
    """The haproxy to run (`--haproxy`, else the host's) and the rounds asked for (`--rounds`),
    for the benchmark `name`."""
    parser = argparse.ArgumentParser(prog=f"python -m benchmarks.{name}", description=doc)
    parser.add_argument("--rounds", type=int, default=5, choices=range(1, 21))
    parser.add_argument("--haproxy", help="an HAProxy binary to run (default: the host's)")
    args = parser.parse_args()
    haproxy = (
        args.haproxy or shutil.which("haproxy") or sys.exit(f"{name}: no haproxy (make setup)")
    )
    return haproxy, int(args.rounds)


def named(haproxy: str) -> str:
    """`HAProxy 2.6.12`: the version `haproxy -v` says, for a benchmark's record."""
    said = subprocess.run([haproxy, "-v"], capture_output=True, text=True, check=True).stdout
    return "HAProxy " + said.split()[2].split("-")[0]


def main() -> None:
    haproxy, count = arguments("door_arrivals", __doc__.splitlines()[0])
    found = asyncio.run(rounds(haproxy, count))
    direct = statistics.median(found[DIRECT])
    print(f"\n{AT_ONCE} requests at once; median arrival at the stand-in ({count} rounds):")
    figures = []
    for name, values in found.items():
        median = statistics.median(values)
        extra = "" if name == DIRECT else f"  (+{median - direct:.1f} ms against direct)"
        print(f"  {name:24} {median:6.1f} ms{extra}")
        figures.append(Figure(name, f"{median:.1f} ms{extra.replace('  (', ' (')}"))
    about = (
        f"The door ({named(haproxy)}, the rendered configuration) and variants of it in front of a"
        f" stand-in on loopback that answers at once; {AT_ONCE} requests sent at the same"
        f" instant, each way, {count} rounds; the median arrival of a whole request."
    )
    record("A request's way in through the door", about, "none: where a burst's cost goes", figures)


if __name__ == "__main__":
    main()
