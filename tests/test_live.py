"""Progress on a terminal (a rich console that says it is one): a start's phases, as the typed
lines readiness reports, as one line per node updated in place; other lines printed as they come,
a plain line that only reads like a phase too; and nothing held back off a terminal."""

from __future__ import annotations

import io

from rich.console import Console

from generator.base.startlog import PhaseLine, Seen
from generator.cli.live import Progress


def terminal(is_one: bool) -> tuple[Console, io.StringIO]:
    screen = io.StringIO()
    return Console(file=screen, force_terminal=is_one, width=100, color_system=None), screen


def phase(text: str, what: str, percent: int | None = None) -> PhaseLine:
    return PhaseLine(text, "serve", "spark1", Seen(what, percent))


def test_on_a_terminal_each_node_keeps_one_line_with_its_current_phase() -> None:
    console, screen = terminal(True)
    progress = Progress(console)
    progress("serve ...")
    progress("serve: spark2: loading weights (14 s)")  # plain text: printed, never parsed
    assert progress.rows == {}
    progress(phase("serve: spark1: loading weights (14 s)", "loading weights"))
    assert [(n, row[1]) for n, row in progress.rows.items()] == [("spark1", "loading weights")]
    since = progress.rows["spark1"][2]
    still = "serve: spark1: still loading weights 45% after 30 s (44 s in all)"
    progress(phase(still, "loading weights", 45))
    assert progress.rows["spark1"][1:3] == ("loading weights 45%", since)  # the same phase
    progress(phase("serve: spark1: compiling (50 s)", "compiling"))
    assert progress.rows["spark1"][1] == "compiling" and progress.live is not None
    progress(phase("serve: spark1: API up (80 s)", "API up"))
    assert progress.live is None  # the last phase: the display ends, its lines stay
    shown = screen.getvalue()
    assert "  serve ...\n" in shown and "serve: spark1: API up (0 s in all)" in shown
    assert "  serve: spark2: loading weights (14 s)\n" in shown


def test_off_a_terminal_every_line_is_printed_as_it_comes() -> None:
    console, screen = terminal(False)
    progress = Progress(console)
    for text, what in (("serve: spark1: loading weights (14 s)", "loading weights"),
                       ("serve: spark1: API up (80 s)", "API up")):  # fmt: skip
        progress(phase(text, what))
    assert progress.live is None
    assert screen.getvalue() == (
        "  serve: spark1: loading weights (14 s)\n  serve: spark1: API up (80 s)\n"
    )
