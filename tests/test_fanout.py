"""The per-node fan-out: every failure surfaces as a PhaseError naming the node."""

from __future__ import annotations

import pytest

from generator.base.errors import PhaseError
from generator.base.fanout import parallel


def test_a_node_that_fails_at_once_is_never_taken_for_one_that_succeeded() -> None:
    """Seen once on the testbed: a worker's phase failed just as the loop woke from a join, and
    the loop, which looked for errors before it looked for running threads, took it for a
    success. The window is too narrow to hit on purpose; this checks the outcome many times."""

    def fails() -> None:
        raise RuntimeError("cannot join")

    for _ in range(300):
        with pytest.raises(PhaseError) as caught:
            parallel("ray-workers", {"spark2": fails, "spark3": lambda: None}, 10, lambda _: None)
        assert caught.value.message == "node 'spark2': phase 'ray-workers' failed: cannot join"


def test_results_of_every_node() -> None:
    assert parallel("x", {"a": lambda: 1, "b": lambda: 2}, 10, lambda _: None) == {"a": 1, "b": 2}
