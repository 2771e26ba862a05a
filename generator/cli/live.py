"""Progress on stderr. On a terminal, a start's phases (operations/readiness.py says them) show as
one line per node that updates in place, with the time spent in the phase; every other line, and
every line when stderr is not a terminal, is printed as it comes."""

from __future__ import annotations

import re
import time

from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

# "serve: spark1: loading weights 45% (14 s)" and "serve: spark1: still compiling after 30 s ..."
PHASE = re.compile(
    r"^(?P<wait>serve): (?P<node>[^\s:]+): (?:still )?(?P<what>.+?)(?: \(\d+ s\)| after .*)?$"
)


DONE = "API up"  # the last phase: the lines stay as they are


def _phase(what: str) -> str:
    return re.sub(r" \d+%$", "", what)


class Progress:
    def __init__(self, console: Console) -> None:
        self.console = console
        self.rows: dict[str, tuple[str, str, float]] = {}  # node -> (wait, phase, since)
        self.first: dict[str, float] = {}  # node -> when its first phase began
        self.live: Live | None = None

    def __call__(self, line: str) -> None:
        found = PHASE.match(line) if self.console.is_terminal else None
        if found is None:
            self.console.print(f"  {line}")
            return
        node, what = found["node"], found["what"]
        shown = self.rows.get(node)
        self.first.setdefault(node, time.monotonic())
        if shown is None or _phase(shown[1]) != _phase(what):
            self.rows[node] = (found["wait"], what, time.monotonic())
        else:  # progress within the phase: its time still counts from its start
            self.rows[node] = (found["wait"], what, shown[2])
        if self.live is None:
            self.live = Live(self, console=self.console, refresh_per_second=2)
            self.live.start()
        if what == DONE:
            self.stop()

    def __rich__(self) -> Group:
        now = time.monotonic()
        return Group(*(Text(f"  {wait}: {node}: {what} ({self._took(node, what, since, now)})")
                       for node, (wait, what, since) in self.rows.items()))  # fmt: skip

    def _took(self, node: str, what: str, since: float, now: float) -> str:
        """Time in the phase; for the last one, the whole start's."""
        return (
            f"{since - self.first[node]:.0f} s in all" if what == DONE else f"{now - since:.0f} s"
        )

    def stop(self) -> None:
        """The last state of every node's line left on the screen."""
        if self.live is not None:
            self.live.stop()
            self.live = None
            self.rows.clear()
            self.first.clear()
