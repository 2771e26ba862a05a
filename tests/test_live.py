"""Progress on a terminal (a rich console that says it is one): a start's phases as one line per
node, updated in place; other lines printed as they come; and nothing held back off a terminal."""

from __future__ import annotations

import io

from rich.console import Console

from generator.cli.live import Progress


def terminal(is_one: bool) -> tuple[Console, io.StringIO]:
    screen = io.StringIO()
    return Console(file=screen, force_terminal=is_one, width=100, color_system=None), screen


def test_on_a_terminal_each_node_keeps_one_line_with_its_current_phase() -> None:
    console, screen = terminal(True)
    progress = Progress(console)
    progress("serve ...")
    progress("serve: spark1: loading weights (14 s)")
    assert [(n, w) for n, (_, w, _) in progress.rows.items()] == [("spark1", "loading weights")]
    since = progress.rows["spark1"][2]
    progress("serve: spark1: still loading weights 45% after 30 s (44 s in all)")
    assert progress.rows["spark1"][1:] == ("loading weights 45%", since)  # the same phase
    progress("serve: spark1: compiling (50 s)")
    assert progress.rows["spark1"][1] == "compiling" and progress.live is not None
    progress("serve: spark1: API up (80 s)")
    assert progress.live is None  # the last phase: the display ends, its lines stay
    shown = screen.getvalue()
    assert "  serve ...\n" in shown and "serve: spark1: API up (0 s in all)" in shown


def test_off_a_terminal_every_line_is_printed_as_it_comes() -> None:
    console, screen = terminal(False)
    progress = Progress(console)
    for line in ("serve: spark1: loading weights (14 s)", "serve: spark1: API up (80 s)"):
        progress(line)
    assert progress.live is None
    assert screen.getvalue() == (
        "  serve: spark1: loading weights (14 s)\n  serve: spark1: API up (80 s)\n"
    )
