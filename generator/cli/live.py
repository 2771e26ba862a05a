"""Progress on stderr. On a terminal, a start's phases (operations/readiness.py says them) show as
one line per node that updates in place, with the time spent in the phase; every other line, and
every line when stderr is not a terminal, is printed as it comes."""

from __future__ import annotations

import time

from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from generator.base.startlog import LAST, PhaseLine


class Progress:
    def __init__(self, console: Console) -> None:
        self.console = console
        # node -> (wait, what it says, since, its phase)
        self.rows: dict[str, tuple[str, str, float, str]] = {}
        self.first: dict[str, float] = {}  # node -> when its first phase began
        self.live: Live | None = None

    def __call__(self, line: str) -> None:
        if not (isinstance(line, PhaseLine) and self.console.is_terminal):
            self.console.print(f"  {line}")
            return
        node, what = line.node, str(line.seen)
        shown = self.rows.get(node)
        self.first.setdefault(node, time.monotonic())
        if shown is None or shown[3] != line.seen.phase:
            self.rows[node] = (line.wait, what, time.monotonic(), line.seen.phase)
        else:  # progress within the phase: its time still counts from its start
            self.rows[node] = (line.wait, what, shown[2], line.seen.phase)
        if self.live is None:
            self.live = Live(self, console=self.console, refresh_per_second=2)
            self.live.start()
        if line.done:
            self.stop()

    def __rich__(self) -> Group:
        now = time.monotonic()
        return Group(*(Text(f"  {wait}: {node}: {what} ({self._took(node, phase, since, now)})")
                       for node, (wait, what, since, phase) in self.rows.items()))  # fmt: skip

    def _took(self, node: str, phase: str, since: float, now: float) -> str:
        """Time in the phase; for the last one, the whole start's."""
        return (
            f"{since - self.first[node]:.0f} s in all" if phase == LAST else f"{now - since:.0f} s"
        )

    def stop(self) -> None:
        """The last state of every node's line left on the screen."""
        if self.live is not None:
            self.live.stop()
            self.live = None
            self.rows.clear()
            self.first.clear()
