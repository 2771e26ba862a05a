"""A bounded load of chat completions from this machine to a testbed node's API (its own
address: nothing else is ever sent to), half of the requests streamed, each recorded with when
it started and ended and whether it was answered; for the fault tests and benchmarks.chaos."""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field

REQUEST_TIMEOUT = 30  # seconds: a request with no answer by then counts as failed
SECONDS = 3600  # a load's length at most, unless its user bounds it otherwise
MAX_RATE = 50  # requests a second over that length, all clients: its bound in count (the
# testbed's model answers about 20 a second); a load that meets it stops sending, and says so


@dataclass
class Request:
    start: float
    end: float
    ok: bool
    streamed: bool
    error: str = ""


@dataclass
class Load:
    """Clients sending chat completions, half of them streamed, until stopped."""

    url: str
    key: str
    model: str
    done: list[Request] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    sent: list[int] = field(default_factory=list)  # requests sent, per client: every one is done
    timeout: float = REQUEST_TIMEOUT  # seconds a request may wait for its answer
    max_tokens: int = 8
    seconds: float = SECONDS  # the load's bound in time; MAX_RATE a second of it, in count
    until: float = 0.0  # when it ends at the latest (set by `running`)
    pause: float = 0.0  # seconds a client waits after each answer (a lighter load)

    def spent(self) -> str:
        """'' while the load may go on; else the bound it met. No client sends past it, so no
        answer comes after it: a wait for answers must not take that for the group's fault."""
        if len(self.done) >= MAX_RATE * self.seconds:
            return (
                f"the load's bound of {MAX_RATE * self.seconds:.0f} requests ({MAX_RATE} a second)"
            )
        if self.until and time.monotonic() >= self.until:
            return f"the load's bound of {self.seconds:g} s"
        return ""

    def run(self, client: int) -> None:
        sent = 0
        while not self.stop.is_set() and not self.spent():
            streamed = (client + sent) % 2 == 0
            start = time.monotonic()
            self.sent[client] += 1
            try:
                error = self._send(streamed)
            except Exception as e:  # whatever the client saw (a cut stream: http.client's own)
                error = f"{type(e).__name__}: {str(e)[:200]}"
            ok = not error
            self.done.append(Request(start, time.monotonic(), ok, streamed, error))
            sent += 1
            if not ok:
                time.sleep(0.2)  # a refused connection must not spin
            self.stop.wait(self.pause)

    def _send(self, streamed: bool) -> str:
        """'' when answered; else what the client saw."""
        body = {"model": self.model, "messages": [{"role": "user", "content": "Say hello."}],
                "max_tokens": self.max_tokens, "stream": streamed}  # fmt: skip
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {self.key}"}
        request = urllib.request.Request(self.url, json.dumps(body).encode(), headers)
        with urllib.request.urlopen(request, timeout=self.timeout) as response:
            if not streamed:
                return "" if json.load(response)["choices"] else "an answer with no choices"
            for raw in response:
                line = raw.decode().strip()
                if line == "data: [DONE]":
                    return ""
                if line.startswith("data: ") and '"error"' in line:
                    return f"an error in the stream: {line[6:200]}"
        return "the stream ended without [DONE]"

    @contextlib.contextmanager
    def running(self, clients: int) -> Iterator[Load]:
        """`clients` of them while inside; on leaving, each ends its request and stops."""
        self.sent[:] = [0] * clients
        self.until = time.monotonic() + self.seconds
        threads = [
            threading.Thread(target=self.run, args=(i,), daemon=True) for i in range(clients)
        ]
        for thread in threads:
            thread.start()
        try:
            yield self
        finally:
            self.stop.set()
            for thread in threads:
                thread.join(self.timeout + 5)

    def failed_after(self, moment: float) -> list[Request]:
        return [r for r in self.done if r.end >= moment and not r.ok]

    def answered_after(self, moment: float) -> list[Request]:
        return [r for r in self.done if r.start >= moment and r.ok]
