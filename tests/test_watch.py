"""watch's policy alone: when it recovers, how long it backs off, when it gives up. The group is a
FAKE that replays a script of check results; time is a fake clock that sleeping advances."""

from __future__ import annotations

import types
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import pytest

from generator.base.containers import SERVICE
from generator.base.errors import PhaseError, WatchGaveUp
from generator.nodes import events
from generator.nodes.events import Sign
from generator.nodes.fleet import Fleet
from generator.nodes.hardware import Reading
from generator.operations.deploy import Deployment
from generator.operations.watch import Policy, watch
from generator.stack.services import Service


class Done(Exception):
    """The script ran out: the test has seen what it wanted."""


class FakeGroup:
    def __init__(
        self,
        checks: list[list[str]],
        recreate_fails: int = 0,
        heat: list[dict[str, Reading]] | None = None,
        signs: list[list[Sign]] | None = None,
        down: list[dict[str, list[str]]] | None = None,
    ) -> None:
        self.checks = list(checks)
        self.down_at = list(down or [])  # sidecars down, one a look; none left: all up
        self.recreate_fails = recreate_fails
        self.readings = list(heat or [])  # one a look; none left: every GPU cool
        self.events = list(signs or [])  # one a pause between checks; none left: none come
        self.calls: list[str] = []
        self.clock = Clock()

    def problems(self, deadline: float) -> list[str]:
        if not self.checks:
            raise Done
        self.calls.append("check")
        return self.checks.pop(0)

    def sidecars(self) -> set[str]:
        return {"front-door", "mtail"}

    def sidecars_down(self) -> dict[str, list[str]]:
        return self.down_at.pop(0) if self.down_at else {}

    def heat(self) -> dict[str, Reading]:
        return self.readings.pop(0) if self.readings else {}

    def signs(self, timeout: float) -> list[Sign]:
        """The next pause's signs: they come 1 s into it; or none, and the whole pause passes."""
        found = self.events.pop(0) if self.events else []
        self.clock.sleep(1 if found else timeout)
        return found

    def quiet(self) -> None:
        self.calls.append("quiet")

    def start_again(self, services: dict[str, list[str]]) -> None:
        self.calls.append(f"start_again {services}")
        if self.recreate_fails:  # an engine that went away fails both
            raise PhaseError("spark2", "contexts", "context 'spark2' does not answer")

    def recreate(self) -> None:
        self.calls.append("recreate")
        if self.recreate_fails:
            self.recreate_fails -= 1
            raise PhaseError("spark2", "contexts", "context 'spark2' does not answer")

    def down(self) -> dict[str, str]:
        self.calls.append("down")
        return {"spark1": "removed", "spark2": "failed: cannot connect"}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def run(group: FakeGroup, policy: Policy) -> tuple[Clock, list[str], BaseException]:
    clock, lines = group.clock, list[str]()
    with pytest.raises((Done, WatchGaveUp)) as raised:
        watch(group, policy, lines.append, clock=clock, sleep=clock.sleep)
    return clock, lines, raised.value


BAD = ["spark2: serve exited (exit 137)"]
POLICY = Policy(interval=5, failures=2, max_recoveries=3, backoff=10, backoff_max=25, stable=60)


def test_a_single_failed_check_is_not_enough() -> None:
    group = FakeGroup([[], BAD, [], []])
    run(group, POLICY)
    assert "recreate" not in group.calls


def test_failures_in_a_row_recreate_the_group_at_once() -> None:
    group = FakeGroup([[], BAD, BAD, []])
    clock, lines, _ = run(group, POLICY)
    assert group.calls == ["check", "check", "check", "recreate", "quiet", "check"]
    assert clock.sleeps == [5, 5, 5, 5]  # no back-off before a first recovery
    assert any("recovery 1/3 now: recreating the whole group (spark2: serve" in x for x in lines)
    assert "watch: recovery 1 done: serving again" in lines


def test_back_off_doubles_up_to_its_cap_then_watch_takes_the_group_down_and_says_so() -> None:
    group = FakeGroup([BAD] * 10, recreate_fails=10)
    clock, lines, error = run(group, POLICY)
    assert group.calls.count("recreate") == 3
    assert group.calls[-1] == "down"
    backoffs = [s for s in clock.sleeps if s != POLICY.interval]
    assert backoffs == [10, 20]  # the first at once, then 10, doubled (under its cap of 25)
    assert isinstance(error, WatchGaveUp)
    assert error.lines() == [
        "watch: gave up after 3 recoveries in a row; last problem: spark2: serve exited (exit 137)",
        "  spark1: removed",
        "  spark2: failed: cannot connect",
        "hint: fix the cause, then start the group again: vllm-compose up CONFIG --watch",
    ]
    assert sum("recovery" in x and "failed: node 'spark2'" in x for x in lines) == 3


def test_recoveries_that_each_hold_briefly_still_reach_the_cap() -> None:
    group = FakeGroup([BAD, BAD, [], BAD, BAD, [], BAD, BAD, [], BAD, BAD])
    _, _, error = run(group, POLICY)
    assert isinstance(error, WatchGaveUp)
    assert group.calls.count("recreate") == 3


def test_a_long_healthy_stretch_starts_the_count_again() -> None:
    healthy_a_while: list[list[str]] = [[]] * 13  # 13 checks 5 s apart: longer than `stable`
    script = [BAD, BAD, *healthy_a_while] * 4
    group = FakeGroup(script)
    _, lines, error = run(group, POLICY)
    assert isinstance(error, Done)
    assert group.calls.count("recreate") == 4
    assert lines.count("watch: healthy for 60 s; the recovery count starts again") == 4


HOT = Reading(97, "GPU 0 at 97 °C, at or over the 90 °C limit", near=True)
WARM = Reading(88, None, near=True)
COOL = Reading(45, None, near=False)


def test_a_restart_waits_while_a_gpu_is_over_the_limit_and_says_so() -> None:
    # Readings: the two checks, then the looks before the restart: hot twice, then cool.
    heat = [{"spark2": COOL}, {"spark2": COOL}, {"spark2": HOT}, {"spark2": HOT}, {"spark2": COOL}]
    group = FakeGroup([BAD, BAD, []], heat=heat)
    clock, lines, _ = run(group, POLICY)
    assert group.calls == ["check", "check", "recreate", "quiet", "check"]
    # A check's interval, two holds of one interval each, then the checks' again.
    assert clock.sleeps == [5, 5, 5, 5, 5]
    held = [x for x in lines if "holding the restart" in x]
    assert (
        held
        == [
            "watch: holding the restart while spark2: GPU 0 at 97 °C, at or over the 90 °C limit;"
            " checking again in 5 s"
        ]
        * 2
    )


def test_a_node_that_vanished_while_hot_is_named_with_heat_as_the_likely_cause() -> None:
    gone = ["spark2: engine does not answer: cannot connect", "spark2: not alive in Ray"]
    # spark2 read near the limit while healthy, then vanished: no reading of it afterwards.
    group = FakeGroup([[], gone], heat=[{"spark1": COOL, "spark2": WARM}, {"spark1": COOL}])
    _, lines, _ = run(group, POLICY)
    failed = next(x for x in lines if "check failed" in x)
    assert failed.endswith(
        "(heat is the likely cause: spark2's GPU was at 88 °C when last seen)"
    ), failed
    assert "spark1" not in failed


def test_a_cool_node_that_vanished_is_not_blamed_on_heat() -> None:
    gone = ["spark2: engine does not answer: cannot connect"]
    group = FakeGroup([[], gone], heat=[{"spark2": COOL}])
    _, lines, _ = run(group, POLICY)
    assert not any("heat" in x for x in lines)


# Signs between checks: the container events of generator/nodes/events.py


def signs_of(*lines: int) -> list[Sign]:
    """Signs from the real events captured from Docker 20.10 (tests/fixtures), by line number."""
    captured = (Path(__file__).parent / "fixtures" / "docker-events-20.10.jsonl").read_text()
    parsed = [events.parse("spark2", line) for line in captured.splitlines()]
    return [s for i, s in enumerate(parsed) if i in lines and s is not None]


KILLED = [2, 3]  # docker kill of ray: its kill (signal 9), then its die (exit 137)
EXITED = [7]  # serve exited by itself (exit 3); Docker started it again


def test_real_events_read_as_the_engine_said_them() -> None:
    kill, die = signs_of(*KILLED)
    assert (kill.service, kill.action, kill.signal) == ("ray", "kill", 9)
    assert (die.service, die.action, die.exit_code) == ("ray", "die", 137)
    assert die.container == kill.container and len(die.container) == 64
    assert die.said() == "spark2: ray exited (exit 137)"
    assert events.parse("spark2", "not json") is None


def test_docker_mends_an_exit_and_a_lost_engine_but_not_a_kill_a_removal_or_bad_health() -> None:
    assert events.heals(signs_of(*EXITED))
    assert events.heals([Sign("spark2", "", "gone")])  # the stack starts again with its engine
    assert not events.heals(signs_of(*KILLED))
    assert not events.heals(signs_of(4))  # destroy
    assert not events.heals([Sign("spark2", "serve", "health_status: unhealthy", "x")])
    # A `docker stop`'s die, in a later batch than its kill (SIGTERM): the follower marks it.
    assert not events.heals([Sign("spark2", "serve", "die", "x", 0, manual=True)])
    assert not events.heals([])


def test_a_container_killed_through_its_engine_is_named_and_started_again_at_once() -> None:
    """Only the killed container is started again (no teardown, no `up`); the supervisors then
    re-form the group around it, and watch waits for that as for any mend."""
    group = FakeGroup([[], BAD, []], signs=[signs_of(*KILLED)])
    clock, lines, _ = run(group, POLICY)
    assert lines[1] == (
        "watch: spark2: ray sent signal 9 through its engine (docker kill or stop);"
        " spark2: ray exited (exit 137)"
    )
    assert group.calls == ["check", "check", "start_again {'spark2': ['ray']}", "check", "quiet"]
    assert clock.sleeps == [1, 2]  # named 1 s into the pause; started again with no other wait
    assert lines[2:] == [
        "watch: confirmed: spark2: serve exited (exit 137)",
        "watch: recovery 1/3 now: starting spark2's ray again; the group's supervisors re-form"
        " the group",
        "watch: healed by watch (started again) and the supervisors in 2 s",
    ]


def test_a_start_again_that_does_not_heal_in_time_is_followed_by_a_recreate() -> None:
    quick = Policy(interval=5, failures=2, max_recoveries=3, backoff=10, heal=4)
    group = FakeGroup([[], BAD, BAD, BAD, []], signs=[signs_of(*KILLED)])
    _, lines, _ = run(group, quick)
    assert group.calls[2:6] == ["start_again {'spark2': ['ray']}", "check", "check", "recreate"]
    assert "watch: not healed in 4 s; recreating the group" in lines
    assert any(line.startswith("watch: recovery 2/3 in 10 s: recreating") for line in lines)


def test_a_second_kill_in_a_row_gets_the_whole_group_after_its_back_off() -> None:
    group = FakeGroup([[], BAD, [], [], BAD], signs=[signs_of(*KILLED), signs_of(*KILLED)])
    _, lines, _ = run(group, POLICY)
    assert group.calls.count("start_again {'spark2': ['ray']}") == 1
    assert group.calls.count("recreate") == 1
    assert any(line.startswith("watch: recovery 2/3 in 10 s: recreating") for line in lines)


def test_only_containers_killed_stopped_or_removed_through_their_engine_are_started_again() -> None:
    assert events.started_again(signs_of(*KILLED)) == {"spark2": ["ray"]}
    assert events.started_again(signs_of(4)) == {"spark2": [signs_of(4)[0].service]}  # removed
    assert events.started_again([Sign("spark2", "serve", "die", "x", 0, manual=True)]) == {
        "spark2": ["serve"]
    }
    assert events.started_again(signs_of(*EXITED)) == {}  # Docker's to start again
    # A serve in the killed Ray container's process namespace exits with it: both start again.
    with_serve = [*signs_of(*KILLED), Sign("spark2", "serve", "die", "y", 137)]
    assert events.started_again(with_serve) == {"spark2": ["ray", "serve"]}
    assert events.started_again([*signs_of(*KILLED), Sign("spark1", "", "gone")]) == {}
    assert events.started_again([Sign("spark2", "serve", "health_status: unhealthy", "x")]) == {}


def test_an_exit_that_docker_and_the_supervisors_mend_is_waited_for_not_raced() -> None:
    # The looks while healing: broken twice, then serving again.
    group = FakeGroup([[], BAD, BAD, []], signs=[signs_of(*EXITED)])
    clock, lines, _ = run(group, POLICY)
    assert "recreate" not in group.calls
    assert lines[1] == "watch: spark2: serve exited (exit 3)"
    assert lines[2] == (
        "watch: Docker starts it again and the group's supervisors re-form the group;"
        " waiting up to 120 s"
    )
    assert "watch: healed by Docker and the supervisors in 6 s" in lines
    assert clock.sleeps[:4] == [1, 2, 2, 2]


def test_a_mend_that_does_not_come_in_time_is_acted_on() -> None:
    quick = Policy(interval=5, failures=2, max_recoveries=3, backoff=10, heal=4)
    group = FakeGroup([[], BAD, BAD, BAD, []], signs=[signs_of(*EXITED)])
    _, lines, _ = run(group, quick)
    assert "watch: not healed in 4 s; recreating the group" in lines
    assert group.calls.count("recreate") == 1


def test_a_sign_the_group_shrugged_off_changes_nothing() -> None:
    group = FakeGroup([[], [], []], signs=[signs_of(*KILLED)])
    _, lines, _ = run(group, POLICY)
    assert "watch: the group serves; nothing to do" in lines
    assert "recreate" not in group.calls


DOOR_KILLED = [Sign("spark1", "front-door", "kill", "d", signal=9),
               Sign("spark1", "front-door", "die", "d", exit_code=137)]  # fmt: skip


def test_a_door_killed_through_its_engine_is_started_again_alone_and_no_recovery_counted() -> None:
    """The front door is not the group: started again at once, as it was, with nothing of the
    group touched or checked for it, and no recovery counted."""
    door = {"spark1": ["front-door"]}
    group = FakeGroup([[], []], signs=[DOOR_KILLED], down=[{}, door])
    clock, lines, _ = run(group, POLICY)
    assert group.calls == ["check", "start_again {'spark1': ['front-door']}", "check"]
    assert clock.sleeps == [1, 5]  # at once: named 1 s into the pause, started with no wait
    assert lines[1:4] == [
        "watch: spark1: front-door sent signal 9 through its engine (docker kill or stop);"
        " spark1: front-door exited (exit 137)",
        "watch: spark1's front-door not running; starting it again",
        "watch: spark1's front-door started again",
    ]
    assert not any("recovery" in line or "confirmed" in line for line in lines)


def test_a_sidecar_found_down_at_a_check_is_started_again_and_one_that_exited_left_to_docker() -> (
    None
):
    """Down before watch started, or its event missed: found at the next look. One that exited
    by itself Docker restarts (it is not down to watch); it is only named."""
    exited = [Sign("spark1", "mtail", "die", "m", exit_code=1)]
    group = FakeGroup([[], []], signs=[exited], down=[{"spark1": ["front-door", "mtail"]}])
    _, lines, _ = run(group, POLICY)
    assert group.calls == ["start_again {'spark1': ['front-door', 'mtail']}", "check", "check"]
    assert lines[0] == "watch: spark1's front-door, mtail not running; starting them again"
    assert "watch: spark1: mtail exited (exit 1)" in lines
    assert not any("Docker starts it again" in line or "healed" in line for line in lines)


def test_a_door_that_cannot_start_again_is_said_and_tried_at_the_next_look() -> None:
    door = {"spark1": ["front-door"]}
    group = FakeGroup([[], []], recreate_fails=1, down=[door, door])
    _, lines, _ = run(group, POLICY)
    assert group.calls.count("start_again {'spark1': ['front-door']}") == 2
    assert lines[1] == (
        "watch: spark1's front-door not started again: node 'spark2': phase 'contexts' failed:"
        " context 'spark2' does not answer"
    )
    assert "recreate" not in group.calls


def test_the_follower_marks_a_die_that_follows_a_kill_in_a_later_batch(tmp_path: Path) -> None:
    """The follower over a FAKE `docker` (a script replaying two real event lines, a second
    apart, as a `docker stop` spreads its kill and die): the die comes marked, so watch does not
    wait for Docker to start a container it never will."""
    captured = (Path(__file__).parent / "fixtures" / "docker-events-20.10.jsonl").read_text()
    kill, die = captured.splitlines()[2:4]
    (tmp_path / "kill").write_text(kill + "\n")
    (tmp_path / "die").write_text(die + "\n")
    fleet = fake_docker(tmp_path, f"cat {tmp_path}/kill\nsleep 1\ncat {tmp_path}/die", "")
    with events.Follower(fleet) as follower:
        first, second = follower.next(10), follower.next(10)
    assert [(s.action, s.manual) for s in first] == [("kill", False)]
    assert [(s.action, s.manual) for s in second] == [("die", True)]
    assert not events.heals(second)


@dataclass(frozen=True)
class FakeNode:
    name: str


@pytest.mark.parametrize(
    ("backend", "named", "started"),
    [
        ("ray", {"spark1": ["ray"]}, {"spark1": ["ray", "serve"]}),
        ("ray", {"spark2": ["ray"]}, {"spark2": ["ray"]}),  # a worker has no serve
        ("native", {"spark1": ["serve"]}, {"spark1": ["serve"]}),
    ],
)
def test_a_heads_ray_started_again_takes_its_serve_with_it(
    backend: str, named: dict[str, list[str]], started: dict[str, list[str]]
) -> None:
    """Serve lives in the head's Ray container's process namespace and dies with it; its die
    may come in a later batch of signs than the kill (seen in CI), so the start names it anyway;
    and each is started once it has ended (a killed container's processes end after its kill
    event; Compose starts nothing while they run). A FAKE fleet: what it is asked is recorded."""
    up: dict[str, list[str]] = {}
    ended: dict[str, list[str]] = {}
    lines: list[str] = []
    one, two = FakeNode("spark1"), FakeNode("spark2")  # hashable, as a Node is
    ray = [Service("ray", [], None), Service("serve", [], None, pid_of="ray")]
    native = [Service("serve", [], None)]
    stacks = {"spark1": ray if backend == "ray" else native, "spark2": [Service("ray", [], None)]}
    fleet = types.SimpleNamespace(
        cluster=types.SimpleNamespace(nodes=[one, two]),
        head=one,
        stacks={name: types.SimpleNamespace(services=s) for name, s in stacks.items()},
        report=lines.append,
        contexts_answer=lambda: None,
        ended=lambda node, services: ended.__setitem__(node.name, services) if not up else None,
        compose_up=lambda node, services: up.__setitem__(node.name, services),
    )
    Deployment(cast(Fleet, fleet)).start_again(named)
    assert up == started and ended == started  # each waited for before any was started
    assert any("serve too" in line for line in lines) == (started != named)


def fake_docker(tmp_path: Path, events_: str, logs: str) -> Fleet:
    """A fleet of one node whose `docker` is a FAKE script (`events` runs `events_`, `logs` runs
    `logs`; each then sleeps) and whose engine lists one running serve container."""
    docker = tmp_path / "docker"
    docker.write_text(
        f'#!/bin/sh\ncase "$1" in\n  events) {events_}\n    exec sleep 30;;\n'
        f"  logs) {logs or ':'}\n    exec sleep 30;;\nesac\n"
    )
    docker.chmod(0o755)
    node = types.SimpleNamespace(name="spark2")
    config = types.SimpleNamespace(docker_cmd=[docker])
    serve = types.SimpleNamespace(
        id="1234abcd",
        name="evtest-serve-1",
        config=types.SimpleNamespace(labels={SERVICE: "serve"}),
    )
    listing = types.SimpleNamespace(list=lambda filters: [serve])  # the engine's running ones
    return cast(Fleet, types.SimpleNamespace(
        cluster=types.SimpleNamespace(name="evtest", nodes=[node]),
        docker={"spark2": types.SimpleNamespace(client_config=config, container=listing)},
    ))  # fmt: skip


# The supervisors' own lines (image/group.py), as `docker logs` hands them on.
SILENT = "vllm-compose: 10.0.0.2:7101 stopped answering; the group breaks if it stays silent 10 s"
BROKE = (
    "vllm-compose: the group broke: its canary failed for 60 s (completion at"
    " http://127.0.0.1:8000/v1/completions failed: timed out); stopping vllm to start it with"
    " the group again"
)


def test_a_supervisors_words_are_signs_the_supervisors_mend() -> None:
    silent = events.supervisor("spark1", "serve", SILENT + "\n")
    broke = events.supervisor("spark1", "serve", BROKE)
    assert silent is not None and broke is not None
    assert silent.said() == "spark1: serve its supervisor: 10.0.0.2:7101 stopped answering"
    assert broke.said() == (
        "spark1: serve its supervisor: the group broke (its canary failed for 60 s (completion"
        " at http://127.0.0.1:8000/v1/completions failed: timed out))"
    )
    assert events.heals([silent]) and events.heals([broke])
    assert not events.heals([silent, *signs_of(*KILLED)])  # a kill still needs watch
    assert events.supervisor("spark1", "serve", "vllm-compose: waiting for the head") is None
    assert events.supervisor("spark1", "serve", "INFO the group broke: not ours") is None


def test_a_followed_log_s_supervisor_lines_come_as_signs(tmp_path: Path) -> None:
    """The follower over a FAKE `docker`: a running container's log (as `docker ps` names it)
    is followed, and its supervisor's line is a sign of that node and service."""
    (tmp_path / "log").write_text(f"INFO some vLLM line\n{SILENT}\n")
    with events.Follower(fake_docker(tmp_path, "", f"cat {tmp_path}/log")) as follower:
        found = follower.next(10)
    assert [(s.node, s.service, s.action) for s in found] == [("spark2", "serve", "silent")]


def test_a_break_the_supervisors_mend_is_waited_for_and_named_as_theirs() -> None:
    broke = events.supervisor("spark1", "serve", BROKE)
    assert broke is not None
    group = FakeGroup([[], BAD, []], signs=[[broke]])
    _, lines, _ = run(group, POLICY)
    assert "recreate" not in group.calls
    assert lines[2] == "watch: the group's supervisors re-form the group; waiting up to 120 s"
    assert "watch: healed by the supervisors in 4 s" in lines


def test_a_break_the_supervisors_say_after_a_failed_check_is_waited_for_not_raced() -> None:
    """A hung rank: watch's check fails first (its canary timed out), then the head's canary
    breaks the group and its supervisor says so: watch waits for the supervisors to re-form the
    group instead of recreating it at its second failed check."""
    broke = events.supervisor("spark1", "serve", BROKE)
    assert broke is not None
    group = FakeGroup([[], BAD, BAD, BAD, []], signs=[[], [broke]])
    _, lines, _ = run(group, POLICY)
    assert "recreate" not in group.calls
    assert lines[1].startswith("watch: check failed (1/2)")
    assert lines[2].startswith("watch: spark1: serve its supervisor: the group broke")
    assert "watch: healed by the supervisors in 6 s" in lines


def test_a_start_again_that_fails_counts_as_a_recovery_and_the_group_is_recreated_next() -> None:
    group = FakeGroup([[], BAD, BAD, []], signs=[signs_of(*KILLED)], recreate_fails=1)
    _, lines, _ = run(group, POLICY)
    assert group.calls[2:4] == ["start_again {'spark2': ['ray']}", "recreate"]
    failed = [line for line in lines if line.startswith("watch: recovery 1 failed: ")]
    assert len(failed) == 1 and "does not answer" in failed[0], lines
    assert any(line.startswith("watch: recovery 2/3 in 10 s: recreating") for line in lines)
