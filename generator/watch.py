"""`vllm-compose watch`: keep a running group serving, or stop it and say why.

Every `interval` seconds the group is checked (Deployment.problems: every service running on every
node, every node alive in Ray, a real completion back within `deadline`). After `failures` failed
checks in a row the whole group is recreated in order, after a back-off that doubles from
`backoff` up to `backoff_max`. Docker's restart policies act per container and only on exit: a
dead worker leaves the head up and serving nothing, and a policy that restarts forever can wedge
the hosts. So recoveries are counted: after `max_recoveries` in a row, without `stable` seconds
of health in between, the group is taken down and watch stops with the last problem.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn, Protocol

from generator.errors import VllmComposeError, WatchGaveUp
from generator.fanout import Report


class Group(Protocol):
    def problems(self, deadline: float) -> list[str]: ...
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
        if not problems:
            _healthy(state, policy, report, clock)
            sleep(policy.interval)
            continue
        state.failed += 1
        report(f"watch: check failed ({state.failed}/{policy.failures}): {'; '.join(problems)}")
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
    try:
        group.recreate()
    except VllmComposeError as e:
        report(f"watch: recovery {state.recoveries} failed: {e.message}")
        return False
    report(f"watch: recovery {state.recoveries} done: serving again")
    return True
