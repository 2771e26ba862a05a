"""watch's canary on its own, with a fake fleet (our logic alone; the real vLLM under load is in
test_e2e.py): a late canary while vLLM makes progress is busy, not broken."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from python_on_whales import DockerException

from generator.operations import readiness
from tests.test_preflight import SAMPLE
from tests.test_startlog import START


class FakeFleet:
    """A head whose canary never answers in time, and whose /metrics read as given in turn."""

    def __init__(self, loads: list[dict[str, float]]) -> None:
        self.cluster, self.head = SAMPLE, SAMPLE.head
        self.loads: Iterator[dict[str, float]] = iter(loads)
        self.reported: list[str] = []

    def execute(self, node: Any, service: str, args: list[str]) -> str:
        if args[1] == "serve":
            raise DockerException(args, 1, stderr=b"vllm-compose-health: completion timed out")
        return json.dumps(next(self.loads))

    def report(self, line: str) -> None:
        self.reported.append(line)


@pytest.fixture(autouse=True)
def no_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(readiness, "PROGRESS_SECONDS", 0)


def load(running: float, tokens: float, waiting: float = 0) -> dict[str, float]:
    return {"running": running, "waiting": waiting, "tokens": tokens}


def test_a_late_canary_while_tokens_rise_is_busy_not_a_problem() -> None:
    fleet = FakeFleet([load(2, 100, 3), load(2, 160, 3)])
    assert readiness.canary(fleet, 1) == []  # type: ignore[arg-type]
    assert fleet.reported == [
        "watch: busy, not broken: the canary took over 1 s; 2 running, 3 waiting, +60 tokens in 0 s"
    ]


@pytest.mark.parametrize(
    "loads",
    [
        [load(0, 100), load(0, 100)],  # idle: nothing excuses the late canary
        [load(2, 100), load(2, 100)],  # requests held but no token comes out: wedged
        [load(0, 100), {"no": "keys"}],  # metrics that say nothing
    ],
)
def test_a_late_canary_without_progress_is_a_problem(loads: list[dict[str, float]]) -> None:
    fleet = FakeFleet(loads)
    assert readiness.canary(fleet, 1) == [  # type: ignore[arg-type]
        "spark-1: canary: completion timed out"
    ]
    assert fleet.reported == []


def test_a_start_is_said_phase_by_phase_from_its_log() -> None:
    fleet = FakeFleet([])
    watched = readiness.Watched(fleet, fleet.head, "serve", "serve")  # type: ignore[arg-type]
    for line in START.splitlines():
        watched.read(line)
    said = [line.split(": ", 2)[2].rsplit(" (", 1)[0] for line in fleet.reported]
    assert said[:2] == ["waiting for the group", "starting vLLM"] and said[-1] == "API up"
    assert len(said) == 7 and watched.started
    assert fleet.reported[3].startswith(f"serve: {fleet.head.name}: loading weights (")
    # Meanwhile, nothing new: the phase it is in, not the probe's refusal.
    assert "still API up after" in readiness._waiting(watched, 12)
    fresh = readiness.Watched(fleet, fleet.head, "serve", "serve")  # type: ignore[arg-type]
    assert "not ready (12 s)" in readiness._waiting(fresh, 12)


def test_a_ray_workers_lines_in_the_drivers_log_are_said_for_its_own_node() -> None:
    fleet = FakeFleet([])
    head, worker = fleet.cluster.nodes[:2]
    watched = readiness.Watched(fleet, head, "serve", "serve")  # type: ignore[arg-type]
    watched.read("(EngineCore pid=3) INFO Starting to load model /models/m...")
    watched.read(
        f"\x1b[36m(RayWorkerProc pid=812, ip={worker.ip})\x1b[0m INFO Starting to load model"
    )
    watched.read(f"(RayWorkerProc pid=812, ip={worker.ip}) INFO Loading weights took 2 s")
    watched.read("(RayWorkerProc pid=90) INFO Capturing CUDA graphs (mixed prefill-decode) 50%")
    said = [line.rsplit(" (", 1)[0] for line in fleet.reported]
    assert said == [
        f"serve: {head.name}: loading weights",
        f"serve: {worker.name}: loading weights",
        f"serve: {head.name}: capturing graphs 50%",
    ]
    assert watched.phases.now is not None and watched.phases.now.phase == "capturing graphs"
