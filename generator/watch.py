"""`vllm-compose watch`: keep a running group serving, or stop it and say why.

Every `interval` seconds the group is checked (Deployment.problems: every service running on every
node, every node alive in Ray, a real completion back within `deadline`). After `failures` failed
checks in a row the whole group is recreated in order, after a back-off that doubles from
`backoff` up to `backoff_max`. Docker's restart policies act per container and only on exit: a
dead worker leaves the head up and serving nothing, and a policy that restarts forever can wedge
the hosts. So recoveries are counted: after `max_recoveries` in a row, without `stable` seconds
of health in between, the group is taken down and watch stops with the last problem.

Each check also reads every node's GPU temperatures. A restart waits while a node's GPU is over
the config's `gpu_temperature_limit` (or throttled for heat), and says so; a node that vanished
while its GPU was near the limit is named with heat as the likely cause (a GPU past its shutdown
temperature takes its node down without a log).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NoReturn, Protocol

from generator.errors import VllmComposeError, WatchGaveUp
from generator.fanout import Report
from generator.hardware import Reading


class Group(Protocol):
    def problems(self, deadline: float) -> list[str]: ...
    def heat(self) -> dict[str, Reading]: ...
    def recreate(self) -> object: ...
    def down(self) -> dict[str, str]: ...


@dataclass(frozen=True)
class Policy:
    interval: float = 30  # seconds between checks
    deadline: float = 60  # seconds the canary completion may take
    failures: int = 2  # failed checks in a row before a recovery
    max_recoveries: int = 5  # recoveries in a row before giving up
    backoff: float = 10  # seconds before the first recovery; doubles for each next one
    backoff_max: float = 300
    stable: float = 600  # healthy this long after a recovery: the count starts again

    def delay(self, recoveries: int) -> float:
        """The back-off before recovery number `recoveries + 1`."""
        return float(min(self.backoff * 2**recoveries, self.backoff_max))


@dataclass
class _State:
    failed: int = 0  # checks in a row with a problem
    recoveries: int = 0  # in a row, without `stable` seconds of health between them
    recovered_at: float = 0.0
    heat: dict[str, Reading] = field(default_factory=dict)  # node -> its last reading


def watch(
    group: Group,
    policy: Policy,
    report: Report,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> NoReturn:
    """Check, recover, repeat; returns only by raising (WatchGaveUp after the cap)."""
    state = _State(recovered_at=clock())
    while True:
        problems = group.problems(policy.deadline)
        state.heat |= group.heat()  # a node that does not answer keeps its last reading
        if not problems:
            _healthy(state, policy, report, clock)
            sleep(policy.interval)
            continue
        state.failed += 1
        said = "; ".join(problems) + _heat_named(state.heat, problems)
        report(f"watch: check failed ({state.failed}/{policy.failures}): {said}")
        if state.failed < policy.failures:
            sleep(policy.interval)
        elif _recovered(group, state, problems[0], policy, report, sleep):
            state.failed, state.recovered_at = 0, clock()
            sleep(policy.interval)
        # A recovery that failed: the next check fails at once and leads to a longer back-off.


def _healthy(state: _State, policy: Policy, report: Report, clock: Callable[[], float]) -> None:
    if state.recoveries and clock() - state.recovered_at >= policy.stable:
        report(f"watch: healthy for {policy.stable:g} s; the recovery count starts again")
        state.recoveries = 0
    report("watch: ok" if not state.failed else "watch: ok again")
    state.failed = 0


def _recovered(
    group: Group,
    state: _State,
    problem: str,
    policy: Policy,
    report: Report,
    sleep: Callable[[float], None],
) -> bool:
    """One recovery after its back-off; whether the group was recreated. After the cap, the
    group is taken down and WatchGaveUp raised."""
    if state.recoveries >= policy.max_recoveries:
        report("watch: giving up; taking the group down on every node")
        raise WatchGaveUp(state.recoveries, problem, group.down())
    delay = policy.delay(state.recoveries)
    state.recoveries += 1
    report(
        f"watch: recovery {state.recoveries}/{policy.max_recoveries} in {delay:g} s:"
        f" recreating the whole group ({problem})"
    )
    sleep(delay)
    _cooled(group, policy, report, sleep)
    try:
        group.recreate()
    except VllmComposeError as e:
        report(f"watch: recovery {state.recoveries} failed: {e.message}")
        return False
    report(f"watch: recovery {state.recoveries} done: serving again")
    return True


def _heat_named(heat: dict[str, Reading], problems: list[str]) -> str:
    """Heat as the likely cause of each node in `problems` whose GPU was near the limit when last
    read; '' when none was."""
    named = [
        f"{node}'s GPU was at {r.hottest:g} °C when last seen"
        for node, r in heat.items()
        if r.near and r.hottest is not None and any(p.startswith(f"{node}: ") for p in problems)
    ]
    return f" (heat is the likely cause: {'; '.join(named)})" if named else ""


def _cooled(group: Group, policy: Policy, report: Report, sleep: Callable[[float], None]) -> None:
    """Hold the restart while a node's GPU is over the limit: starting vLLM heats it further."""
    while hot := {node: r.too_hot for node, r in group.heat().items() if r.too_hot}:
        held = "; ".join(f"{node}: {why}" for node, why in hot.items())
        report(f"watch: holding the restart while {held}; checking again in {policy.interval:g} s")
        sleep(policy.interval)
