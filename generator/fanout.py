"""Run one piece of work per node at once: `parallel` with progress, turning the first failure into
a PhaseError that names the node; `settle` waiting for every node and handing back each outcome."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

from python_on_whales import DockerException

from generator.errors import DockerError, PhaseError

T = TypeVar("T")
Report = Callable[[str], None]


def parallel(
    phase: str, work: dict[str, Callable[[], T]], timeout: float, report: Report
) -> dict[str, T]:
    """Run one callable per node at once; report progress every few seconds; the first failure
    (or the deadline) becomes a PhaseError naming the node. Daemon threads: a phase that timed out
    does not hold the command open while a docker call it started finishes."""
    results: dict[str, T] = {}
    errors: dict[str, BaseException] = {}

    def run(name: str, fn: Callable[[], T]) -> None:
        try:
            results[name] = fn()
        except BaseException as e:  # re-raised below as a PhaseError
            errors[name] = e

    threads = {n: threading.Thread(target=run, args=(n, fn), daemon=True) for n, fn in work.items()}
    for thread in threads.values():
        thread.start()
    start = time.monotonic()
    while True:
        # Which threads still run, before looking for errors: a thread records its error before
        # it ends, so one that ended with an error is never mistaken for one that succeeded.
        pending = [n for n, t in threads.items() if t.is_alive()]
        if errors:
            name = next(iter(errors))
            raise _phase_error(phase, name, errors[name])
        if not pending:
            return results
        elapsed = time.monotonic() - start
        if elapsed > timeout:
            raise PhaseError(pending[0], phase, f"timed out after {timeout:g} s")
        threads[pending[0]].join(timeout=min(5.0, timeout - elapsed + 0.1))
        if threads[pending[0]].is_alive():
            report(f"{phase}: waiting for {', '.join(pending)} ({time.monotonic() - start:.0f} s)")


def settle(work: dict[str, Callable[[], T]], timeout: float) -> dict[str, T | BaseException]:
    """Run one callable per node at once and wait for every one, at most `timeout` seconds:
    node -> its result, or its error (TimeoutError for one still running at the deadline)."""
    results: dict[str, T | BaseException] = {}

    def run(name: str, fn: Callable[[], T]) -> None:
        try:
            results[name] = fn()
        except Exception as e:  # handed back to the caller
            results[name] = e

    threads = {n: threading.Thread(target=run, args=(n, fn), daemon=True) for n, fn in work.items()}
    for thread in threads.values():
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads.values():
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
    late = TimeoutError(f"no answer in {timeout:g} s")
    return {n: results.get(n, late) for n in work}


def _phase_error(phase: str, node: str, error: BaseException | None) -> PhaseError:
    if isinstance(error, PhaseError):
        return error
    if isinstance(error, DockerError):
        return PhaseError(error.node, phase, error.what, error.detail, error.hint)
    if isinstance(error, DockerException):
        return PhaseError(node, phase, last_line(error.stderr), error.stderr or "")
    return PhaseError(node, phase, str(error))


def last_line(text: str | None) -> str:
    lines = [line for line in (text or "").splitlines() if line.strip()]
    return lines[-1].strip() if lines else "docker failed"
