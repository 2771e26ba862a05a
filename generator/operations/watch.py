"""`vllm-compose watch`: keep a running group serving, or stop it and say why.

Between checks, watch follows every node's container events and the group's supervisors' lines
(generator/nodes/events.py): a container of the group that dies, is killed, stopped, removed or
turns unhealthy, a peer that stops answering (a cut link) and a group that broke (a hung rank
failing the head's canary) are named at once. Where Docker brings it back by itself (an exit or
OOM kill under the stacks' restart policy) and the group's supervisors re-form the group, or the
supervisors alone do, watch waits up to `heal` seconds and says so, rather than racing them with
a recreate; where nothing else will act (killed or stopped through its engine, removed,
unhealthy), it confirms with a check and acts at once: a container killed, stopped or removed is
started again as it was (the first recovery in a row) and the supervisors re-form the group
around it; anything else, or a start that does not heal in time, recreates the group.

The sidecars (the front door, and with `metrics` its exporters) are not the group: one that
exited Docker starts again by itself, and one killed, stopped or removed through its engine watch
starts again alone, at once and at every check, without touching the group or counting a
recovery. The door above all: the group's clients reach it through the door.

Every `interval` seconds the group is also checked (Deployment.problems: every service running on
every node, every node alive in Ray, a real completion back within `deadline`): the fallback for
what neither an event nor a supervisor names. After `failures` failed checks in a row the whole
group is recreated in order. The first recovery starts at once; one that follows it without
`stable` seconds of health waits a back-off that doubles from `backoff` up to `backoff_max`.
Docker's restart policies act per container and only on exit: a dead worker leaves the head up
and serving nothing, and a policy that restarts forever can wedge the hosts. So recoveries are
counted: after `max_recoveries` in a row, the group is taken down and watch stops with the last
problem.

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

from generator.base.errors import VllmComposeError, WatchGaveUp
from generator.base.fanout import Report
from generator.nodes.events import RESTARTED, Sign, heals, started_again
from generator.nodes.hardware import Reading


class Group(Protocol):
    def problems(self, deadline: float) -> list[str]: ...
    def sidecars(self) -> set[str]: ...
    def sidecars_down(self) -> dict[str, list[str]]: ...
    def heat(self) -> dict[str, Reading]: ...
    def signs(self, timeout: float) -> list[Sign]: ...
    def quiet(self) -> None: ...
    def start_again(self, services: dict[str, list[str]]) -> None: ...
    def recreate(self) -> object: ...
    def down(self) -> dict[str, str]: ...


@dataclass(frozen=True)
class Policy:
    interval: float = 30  # seconds between checks
    deadline: float = 60  # seconds the canary completion may take
    failures: int = 2  # failed checks in a row before a recovery
    max_recoveries: int = 5  # recoveries in a row before giving up
    backoff: float = 10  # seconds before a second recovery in a row; doubles for each next one
    backoff_max: float = 300
    stable: float = 600  # healthy this long after a recovery: the count starts again
    heal: float = 120  # seconds a fault Docker and the supervisors mend by themselves may take

    def delay(self, recoveries: int) -> float:
        """The back-off before recovery number `recoveries + 1`: none before the first."""
        if not recoveries:
            return 0.0
        return float(min(self.backoff * 2 ** (recoveries - 1), self.backoff_max))


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
        _kept(group, report)
        problems = group.problems(policy.deadline)
        state.heat |= group.heat()  # a node that does not answer keeps its last reading
        if not problems:
            _healthy(state, policy, report, clock)
            _signed(group, state, group.signs(policy.interval), policy, report, (clock, sleep))
            continue
        state.failed += 1
        said = "; ".join(problems) + _heat_named(state.heat, problems)
        report(f"watch: check failed ({state.failed}/{policy.failures}): {said}")
        if state.failed < policy.failures:  # a sign meanwhile is named and acted on at once
            _signed(group, state, group.signs(policy.interval), policy, report, (clock, sleep))
        elif _recovered(group, state, problems[0], policy, report, sleep):
            state.failed, state.recovered_at = 0, clock()
            group.signs(policy.interval)
        # A recovery that failed: the next check fails at once and leads to a longer back-off.


Time = tuple[Callable[[], float], Callable[[float], None]]  # (clock, sleep)
HEAL_POLL = 2.0  # seconds between looks while Docker and the supervisors mend a fault


def _signed(
    group: Group, state: _State, signs: list[Sign], policy: Policy, report: Report, time_: Time
) -> None:
    """Signs that came between checks: named at once; then waited for, where Docker and the
    group's supervisors mend them by themselves, or confirmed and recovered from at once."""
    if not signs:
        return
    clock, sleep = time_
    report(f"watch: {'; '.join(dict.fromkeys(s.said() for s in signs))}")
    _kept(group, report)
    signs = [s for s in signs if s.service not in group.sidecars()]
    if not signs:
        return
    if heals(signs):
        docker = any(s.action in RESTARTED for s in signs)
        who = "Docker and the supervisors" if docker else "the supervisors"
        how = "Docker starts it again and the" if docker else "the"
        report(f"watch: {how} group's supervisors re-form the group; waiting up to"
               f" {policy.heal:g} s")  # fmt: skip
        if _healed(group, policy, report, time_, who):
            return
    problems = group.problems(policy.deadline)
    if not problems:
        report("watch: the group serves; nothing to do")
        return
    state.failed = policy.failures
    report(f"watch: confirmed: {'; '.join(problems)}{_heat_named(state.heat, problems)}")
    services = started_again(signs)
    restarted = bool(services) and _restarted(group, state, services, policy, report, time_)
    if restarted or _recovered(group, state, problems[0], policy, report, sleep):
        state.failed, state.recovered_at = 0, clock()


def _kept(group: Group, report: Report) -> None:
    """The sidecars that are down and that Docker will not start again (the front door above
    all: the group's clients reach it through the door) started again alone, at once, as they
    were: no recovery of the group, and not counted as one."""
    down = group.sidecars_down()
    if not down:
        return
    named = "; ".join(f"{node}'s {', '.join(names)}" for node, names in down.items())
    them = "them" if sum(map(len, down.values())) > 1 else "it"
    report(f"watch: {named} not running; starting {them} again")
    try:
        group.start_again(down)
    except VllmComposeError as e:
        report(f"watch: {named} not started again: {e.message}")
        return
    report(f"watch: {named} started again")


def _healed(group: Group, policy: Policy, report: Report, time_: Time, who: str) -> bool:
    """Wait up to `heal` seconds, looking every HEAL_POLL s, for the group to serve again."""
    clock, sleep = time_
    start = clock()
    while clock() - start < policy.heal:
        sleep(HEAL_POLL)
        if not group.problems(policy.deadline):
            report(f"watch: healed by {who} in {clock() - start:.0f} s")
            group.quiet()
            return True
    report(f"watch: not healed in {policy.heal:g} s; recreating the group")
    return False


def _restarted(
    group: Group,
    state: _State,
    services: dict[str, list[str]],
    policy: Policy,
    report: Report,
    time_: Time,
) -> bool:
    """The first recovery in a row from containers killed, stopped or removed through their
    engine: only those started again, as they were; the group's supervisors then re-form the
    group around them (a start of vLLM, no teardown and no `up`). False when it is not the first
    (the whole group then, after its back-off) or did not heal in time."""
    if state.recoveries:
        return False
    state.recoveries += 1
    named = "; ".join(f"{node}'s {', '.join(names)}" for node, names in services.items())
    report(f"watch: recovery {state.recoveries}/{policy.max_recoveries} now: starting {named}"
           " again; the group's supervisors re-form the group")  # fmt: skip
    try:
        group.start_again(services)
    except VllmComposeError as e:
        report(f"watch: recovery {state.recoveries} failed: {e.message}")
        return False
    return _healed(group, policy, report, time_, "watch (started again) and the supervisors")


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
    when = f"in {delay:g} s" if delay else "now"
    report(
        f"watch: recovery {state.recoveries}/{policy.max_recoveries} {when}:"
        f" recreating the whole group ({problem})"
    )
    if delay:
        sleep(delay)
    _cooled(group, policy, report, sleep)
    try:
        group.recreate()
    except VllmComposeError as e:
        report(f"watch: recovery {state.recoveries} failed: {e.message}")
        return False
    finally:
        group.quiet()  # the recovery's own events are not faults
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
