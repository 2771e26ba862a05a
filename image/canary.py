"""The head serve's canary (standard library only): a hung rank emits no event and exits
nothing, yet the API stops answering while vLLM counts no token. The group supervisor (group.py)
asks `Canary.verdict` at each look and breaks the group when it names a hang, so the nodes re-form
the group by themselves.

Two looks, each from its own thread every `every` seconds: a one-token completion, and vLLM's
token count. Either moving is progress (an answer; a count above the last one read). A completion
sent just before a hang waits out its timeout and may still come back with the last tokens, so
the completion alone would find a hang up to a timeout late; the count, read apart from it, stops
moving the moment the ranks do.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Canary:
    """Armed by the first answer after each start; once armed, `limit` seconds with no progress
    seen break the group."""

    check: Callable[[], str | None]  # a completion: None when answered, else why not
    tokens: Callable[[], float | None]  # vLLM's tokens counted so far; None when unread
    limit: float
    every: float = 5
    armed: bool = False
    progress_at: float = 0.0  # when progress was last seen (armed only)
    last: str = ""  # why the last completion failed
    start: int = 0  # the command's start the looks belong to: older ones are dropped
    looking: bool = False

    def restart(self) -> None:
        self.armed, self.last = False, ""
        self.start += 1

    def verdict(self) -> str:
        """Why the served API counts as hung ('' while it moves, or before it first answered)."""
        if not self.looking:
            self.looking = True
            for look in (self._answered, self._counted()):
                threading.Thread(target=_every, args=(self.every, look), daemon=True).start()
        quiet = time.monotonic() - self.progress_at
        if self.armed and quiet >= self.limit:
            why = f": {self.last}" if self.last else ""
            return f"its canary failed for {self.limit:g} s (no answer, no token counted{why})"
        return ""

    def _moved(self, start: int, arms: bool) -> None:
        if start == self.start and (arms or self.armed):
            self.armed, self.progress_at, self.last = True, time.monotonic(), ""

    def _answered(self) -> None:
        start = self.start
        problem = self.check()
        if problem is None:
            self._moved(start, arms=True)
        elif start == self.start:
            self.last = problem

    def _counted(self) -> Callable[[], None]:
        seen: list[tuple[int, float]] = []  # (start, count) of the last read

        def look() -> None:
            start, count = self.start, self.tokens()
            if count is None:
                return
            if seen and seen[0][0] == start and count > seen[0][1]:
                self._moved(start, arms=False)
            seen[:] = [(start, count)]

        return look


def _every(seconds: float, look: Callable[[], None]) -> None:
    """`look` again and again, each begun `seconds` after the last one began (or when it ends,
    if it took longer)."""
    while True:
        began = time.monotonic()
        look()
        time.sleep(max(0.0, began + seconds - time.monotonic()))
