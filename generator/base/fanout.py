"""Work on every node at once: `each` runs one callable per node and hands back every outcome
(with progress while it waits); `parallel` turns the first failure into a PhaseError naming the
node; `pump` reads a stream of lines on a thread of its own. The only module that starts threads.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable
from typing import TypeVar

from generator.base.errors import DockerError, PhaseError, reason

T = TypeVar("T")
Report = Callable[[str], None]
EVERY = 5.0  # seconds between progress lines while waiting


class Late(TimeoutError):
    """Still running at the deadline."""


def each(
    work: dict[str, Callable[[], T]],
    timeout: float,
    report: Report | None = None,
    what: str = "",
    stop_on_error: bool = False,
) -> dict[str, T | BaseException]:
    """One callable per node at once; node -> its result or the exception it raised (`Late` for
    each still running at the deadline or, with `stop_on_error`, when the first one failed), in
    the order of `work`. Daemon threads: work that is given up on does not
    hold the command open. With `report`, says every few seconds which are still running."""
    done: dict[str, T | BaseException] = {}

    def run(name: str, fn: Callable[[], T]) -> None:
        try:
            found: T | BaseException = fn()
        except Exception as e:  # handed back to the caller
            found = e
        done[name] = found

    threads = {n: threading.Thread(target=run, args=(n, fn), daemon=True) for n, fn in work.items()}
    for thread in threads.values():
        thread.start()
    start = time.monotonic()
    while True:
        # Which threads still run, before looking at what is done: a thread records its outcome
        # before it ends, so one that ended is never taken for one still running.
        pending = [n for n, t in threads.items() if t.is_alive()]
        failed = stop_on_error and any(isinstance(v, BaseException) for v in list(done.values()))
        left = start + timeout - time.monotonic()
        if not pending or failed or left <= 0:
            break
        threads[pending[0]].join(timeout=min(EVERY, left))
        if report and threads[pending[0]].is_alive():
            still = [n for n in pending if threads[n].is_alive()]
            report(f"{what}: waiting for {', '.join(still)} ({time.monotonic() - start:.0f} s)")
    late = Late(f"no answer in {timeout:g} s")
    finished = dict(done)
    return {n: finished.get(n, late) for n in work}


def parallel(
    phase: str, work: dict[str, Callable[[], T]], timeout: float, report: Report
) -> dict[str, T]:
    """`each`, where the first failure (or the deadline) is a PhaseError naming the node."""
    outcome = each(work, timeout, report, phase, stop_on_error=True)
    for name, found in outcome.items():
        if isinstance(found, Late):
            continue
        if isinstance(found, BaseException):
            raise _phase_error(phase, name, found)
    late = [name for name, found in outcome.items() if isinstance(found, Late)]
    if late:
        raise PhaseError(late[0], phase, f"timed out after {timeout:g} s")
    return {name: found for name, found in outcome.items() if not isinstance(found, BaseException)}


def pump(
    lines: Iterable[str], out: queue.Queue[str | None] | None = None
) -> queue.Queue[str | None]:
    """The lines as they come into `out` (a new queue unless given), on a thread of their own;
    None once they end."""
    out = queue.Queue() if out is None else out

    def run() -> None:
        try:
            for line in lines:
                out.put(line)
        finally:
            out.put(None)

    threading.Thread(target=run, daemon=True).start()
    return out


def _phase_error(phase: str, node: str, error: BaseException) -> PhaseError:
    if isinstance(error, PhaseError):
        return error
    if isinstance(error, DockerError):
        return PhaseError(error.node, phase, error.what, error.detail, error.hint)
    return PhaseError(node, phase, reason(error), getattr(error, "stderr", None) or "")
