"""The head serve's canary (standard library only): a hung rank emits no event and exits
nothing, yet the API stops answering while vLLM counts no token. The group supervisor (group.py)
asks `Canary.verdict` at each look and breaks the group when it names a hang, so the nodes re-form
the group by themselves.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Canary:
    """A check of the served API (None: it answered; else why not), run from a thread every
    `every` seconds; armed by its first answer after each start."""

    check: Callable[[], str | None]
    limit: float  # seconds of failing, once armed, that break the group
    every: float = 5
    armed: bool = False
    failing_since: float | None = None
    last: str = ""
    running: threading.Thread | None = None
    began: float = 0.0  # when the running check began
    start: int = 0  # the command's start the checks belong to: older answers are dropped

    def restart(self) -> None:
        self.armed, self.failing_since, self.last = False, None, ""
        self.start += 1

    def verdict(self) -> str:
        """Why the served API counts as hung ('' while it answers, or before it first did)."""
        now = time.monotonic()
        if self.running is None or not self.running.is_alive():
            if now - self.began >= self.every:
                self.began = now
                look = (now, self.start)
                self.running = threading.Thread(target=self._look, args=look, daemon=True)
                self.running.start()
        elif self.armed and now - self.began >= self.limit:  # the check itself hangs
            self.failing_since = self.failing_since or self.began
            self.last = f"no answer for {now - self.began:.0f} s"
        if self.armed and self.failing_since and now - self.failing_since >= self.limit:
            return f"its canary failed for {self.limit:g} s ({self.last})"
        return ""

    def _look(self, began: float, start: int) -> None:
        problem = self.check()
        if start != self.start:
            return
        if problem is None:
            self.armed, self.failing_since = True, None
        elif self.armed:
            self.failing_since = self.failing_since or began
            self.last = problem
