"""What the front door's HAProxy spends forwarding a streamed answer, token by token, and what its
stream-usage filter (stack/doorusage.py) adds to it, side by side in one run on this machine's
loopback.

    python -m benchmarks.door_stream [--rounds N]

HAProxy (the host's, Debian's package, or `--haproxy PATH`) runs the front door's configuration as
the tool renders it at its defaults. Behind it is a stand-in for vLLM (an asyncio server here) that
streams chat completion chunks shaped as vLLM's, one event a millisecond on each stream, as a model
sends tokens (so the door reads each event on its own, as it does in front of a model; each event's
text is when it was sent, which benchmarks.door_latency reads); it measures the door alone, not a
model. Each round sends STREAMS streams at once, of EVENTS events each, in four ways: for reference,
a stream through the door with its filter taken out of the configuration; a stream that asks for no
usage (the filter passes each event on and keeps the part of one under way, to end the stream
cleanly if the model server breaks it off); one that asks for its usage (the filter also reads every
event for the last one's usage: `bench` and most agents' clients ask); and, with `metrics` on, one
that does not ask (the door asks in its stead and takes the usage's event out again). Printed: the
door's CPU time a streamed event (its processes' own count, from /proc), the median over the rounds,
and what the filter adds.

Traffic goes to 127.0.0.1 only; every loop is bounded; the haproxy processes it starts it ends,
by their IDs.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.door_arrivals import arguments, free_port, running
from benchmarks.report import Figure, record
from generator.stack import doorfiles, frontdoor
from tests.support.door import runnable

STREAMS, EVENTS, GAP = 8, 300, 0.001  # streams at once, events each, seconds between events
KEY = "bench-key"
MODEL = "/models/Qwen3.5-122B-A10B-FP8"
CHOICE = {"index": 0, "delta": {"content": " token"}, "logprobs": None, "finish_reason": None}
CHUNK = {  # one token's event, as vLLM sends it
    "id": "chatcmpl-5f0c7a3e9b2d4c6a8e1f0b3d5c7a9e2f",
    "object": "chat.completion.chunk",
    "created": 1764892800,
    "model": MODEL,
    "choices": [CHOICE],
}
USAGE = {"prompt_tokens": 256, "completion_tokens": EVENTS, "total_tokens": 256 + EVENTS}
Options = dict[str, bool] | None  # a request's stream_options
# name -> (the filter in, metrics on, the request's stream_options)
WAYS: dict[str, tuple[bool, bool, Options]] = {
    "no filter (reference)": (False, False, None),
    "asks for no usage": (True, False, None),
    "asks for its usage": (True, False, {"include_usage": True}),
    "metrics: the door asks": (True, True, None),
}


def stamped() -> dict[str, object]:
    """A token's event whose text is when it was sent (time.monotonic_ns): door_latency reads it."""
    return {**CHUNK, "choices": [{**CHOICE, "delta": {"content": str(time.monotonic_ns())}}]}


def event(data: object) -> bytes:
    text = json.dumps(data, separators=(",", ":")) if not isinstance(data, str) else data
    body = b"data: %s\n\n" % text.encode()
    return b"%x\r\n%s\r\n" % (len(body), body)


async def stand_in(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """vLLM's stream, for one request: EVENTS token events GAP apart, then, when asked, the
    usage's event (no choices), then [DONE]."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:  # a probe of the port (door_latency's), no request
        return
    if b"content-length:" in head.lower():
        length = next(int(x.split(b":")[1]) for x in head.split(b"\r\n") if b"length:" in x.lower())
        body = await reader.readexactly(length)
    else:  # chunked: the door changed the body (metrics: it asked)
        body = b""
        while size := int(await reader.readline(), 16):
            body += await reader.readexactly(size + 2)
        await reader.readline()
    asked = (json.loads(body.strip()).get("stream_options") or {}).get("include_usage")
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                 b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n")  # fmt: skip
    for _ in range(EVENTS):
        writer.write(event(stamped()))
        await writer.drain()
        await asyncio.sleep(GAP)
    if asked:
        writer.write(event({**CHUNK, "choices": [], "usage": USAGE}))
    writer.write(event("[DONE]") + b"0\r\n\r\n")
    await writer.drain()
    writer.close()


async def asked(port: int, options: Options) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A streamed chat completion sent to 127.0.0.1:`port`, with KEY: its connection."""
    request = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    body = json.dumps(request if options is None else {**request, "stream_options": options})
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: door\r\ncontent-type: application/json\r\n"
        b"authorization: Bearer %s\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s"
        % (KEY.encode(), len(body), body.encode())
    )
    await writer.drain()
    return reader, writer


async def stream(port: int, options: Options) -> int:
    """One streamed chat completion through the door; the events its client got."""
    reader, writer = await asked(port, options)
    answer = await reader.read()
    writer.close()
    return answer.count(b"data: ")


def cpu_ns(pid: int) -> int:
    """CPU time of the process and its children (HAProxy's master and its worker), in ns."""
    tree = [pid] + [
        int(p.name) for p in Path("/proc").iterdir()
        if p.name.isdigit() and _parent(p) == pid
    ]  # fmt: skip
    return sum(int(Path(f"/proc/{p}/schedstat").read_text().split()[0]) for p in tree)


def _parent(proc: Path) -> int | None:
    try:
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


async def per_event(haproxy: str, upstream: int, way: tuple[bool, bool, Options]) -> float:
    """The door's CPU a streamed event, in µs, over STREAMS streams at once."""
    filtered, metrics, options = way
    route = doorfiles.Route(MODEL, upstream)
    port, counts = free_port(), free_port() if metrics else None  # mtail's: none listens (UDP)
    text = frontdoor.config(port, 120, route, frontdoor.Limits(0, 0), counts)
    if not filtered:
        text = "".join(line for line in text.splitlines(True) if "filter lua." not in line)
    with tempfile.TemporaryDirectory(prefix="door-stream-") as tmp:
        cfg = runnable(Path(tmp), text, {doorfiles.ADMIN: KEY}, [route])
        with running(haproxy, cfg, port) as pid:
            await stream(port, options)  # the first: its start, not counted
            before = cpu_ns(pid)
            got = await asyncio.wait_for(
                asyncio.gather(*(stream(port, options) for _ in range(STREAMS))), 60
            )
            used = cpu_ns(pid) - before
    wanted = EVENTS + 1 + (options is not None and bool(options.get("include_usage")))
    if got != [wanted] * STREAMS:
        raise SystemExit(f"door_stream: the clients got {got} events, not {wanted} each")
    return used / 1000 / (STREAMS * EVENTS)


async def rounds(haproxy: str, count: int) -> dict[str, list[float]]:
    server = await asyncio.start_server(stand_in, "127.0.0.1", 0)
    upstream = int(server.sockets[0].getsockname()[1])
    found: dict[str, list[float]] = {name: [] for name in WAYS}
    for number in range(1, count + 1):
        print(f"round {number} of {count}", flush=True)
        for name, way in WAYS.items():
            found[name].append(await per_event(haproxy, upstream, way))
    server.close()
    return found


def main() -> None:
    haproxy, count = arguments("door_stream", __doc__.splitlines()[0])
    found = asyncio.run(rounds(haproxy, count))
    first = next(iter(WAYS))  # the door without its filter
    plain = statistics.median(found[first])
    print(f"\nthe door's CPU a streamed event, {STREAMS} streams of {EVENTS} events at once"
          f" (median of {count} rounds):")  # fmt: skip
    figures = []
    for name, values in found.items():
        median = statistics.median(values)
        extra = "" if name == first else f"  ({median / plain:.2f}x, {median - plain:+.1f} us)"
        print(f"  {name:24} {median:6.1f} us{extra}")
        figures.append(Figure(name, f"{median:.1f} µs an event{extra.replace('  (', ' (')}"))
    about = (f"The door's HAProxy in front of a stand-in streaming vLLM-shaped events on loopback,"
             f" {STREAMS} streams of {EVENTS} events at once; the door's CPU time a streamed"
             f" event, each way side by side, {count} rounds.")  # fmt: skip
    record("The door's stream filter", about, "none: the filter's price per event", figures)


if __name__ == "__main__":
    main()
