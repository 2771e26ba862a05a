"""Bring a group up in phases, each with its own timeout, timed; take it down; recreate it.

up: contexts answer -> (with a lock: no node holds another image) -> wrapper image on every node
    -> secrets -> preflight -> the front door (routed; it answers) -> every node's Ray and the
    head's serve, all at once (native: the headless ranks, then serve), ready at its first real
    completion. A failed phase is named at once, then takes the group down (unless kept).
watch (operations/watch.py decides when): `problems` checks the running group, `recreate` takes
    it down in order and runs `up` again.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from python_on_whales import DockerException

from generator.base import probes
from generator.base.errors import DockerError, PhaseError, VllmComposeError, reason
from generator.base.fanout import each, parallel
from generator.config import Node, ports
from generator.nodes import door, events, secrets, survey
from generator.nodes.fleet import DOWN_TIMEOUT, Fleet
from generator.nodes.hardware import Reading
from generator.operations import evidence, lock, observe, preflight, readiness
from generator.operations.stamps import Stamps
from generator.stack import claims
from generator.stack.services import sharing

START_TIMEOUT = 150  # creating and starting a service's container with Compose


@dataclass(frozen=True)
class Timeouts:
    contexts: int = 30
    ray: int = 120  # starting every node's Ray container
    join: int = 300  # every node's Ray in the head's GCS, counted from serve's start
    serve: int | None = None  # default: the config's vllm.startup_timeout


@dataclass
class Result:
    phases: list[tuple[str, float]] = field(default_factory=list)
    images: dict[str, str] = field(default_factory=dict)
    endpoint: str = ""


@dataclass
class Deployment:
    fleet: Fleet
    locked: lock.Lock | None = None
    lock_file: Path = Path("cluster.lock.json")
    accept_drift: bool = False  # just re-locked: nodes holding another image get the locked one
    logs: Path = Path("vllm-compose-logs")  # where a failed group's logs are saved (evidence.py)
    stamped: Stamps | None = None  # the model files as verify last found them (stamps.py)
    timeouts: Timeouts = Timeouts()
    # The nodes' clusters, stopped ones too, as opening the config found them (survey.on_nodes):
    # the first stage's look; every later one (watch's recreate) looks afresh.
    seen: survey.Seen | None = None
    follower: events.Follower | None = None  # while `watch` follows the nodes' events

    def up(
        self, checks: bool = True, keep_on_failure: bool = False, door_stays: bool = False
    ) -> Result:
        """A start phase that fails takes the whole group down again (a half-started group serves
        nothing and holds ports), and the front door unless `door_stays` (watch's recreate: it
        holds requests for the next try), unless `keep_on_failure`; the error names the cause."""
        result = Result()
        self.stage(result, checks)
        self.start(result, keep_on_failure, door_stays)
        return result

    def stage(self, result: Result, checks: bool = True) -> None:
        """Everything before a start, none of which touches a running group: contexts, the
        image on every node, the secrets, preflight."""
        fleet, seen, self.seen = self.fleet, self.seen, None
        # Engines the config's opening look reached are not asked again; a recreate looks anew.
        reached, timeout = set(seen or ()), self.timeouts.contexts
        self._phase(result, "contexts", lambda: fleet.contexts_answer(timeout, reached))
        if seen is None or len(seen) < len(fleet.cluster.nodes):  # none taken, or one missed
            seen = survey.of(fleet.cluster, stopped=True)
        theirs, ours = claims.split(seen, fleet.cluster.name, fleet.source)
        # Before the secrets: they would replace that cluster's.
        claims.refuse_same_name(fleet.cluster.name, fleet.source, theirs)
        others = {node: [c for c in on if claims.live(c)] for node, on in theirs.items()}
        if self.locked and not self.accept_drift:
            lock.refuse_image_drift(fleet, self.locked, self.lock_file)
        self._phase(result, "image", lambda: result.images.update(self._images()))
        self._phase(result, "secrets", lambda: self._secrets(ours))
        if checks:
            # A refused config leaves nothing of its own behind: its preflight's one-off
            # containers made the project's volumes where it had none.
            before = survey.volumes(fleet.cluster)
            try:
                self._phase(result, "preflight", lambda: self._preflight(others))
            except VllmComposeError:
                fleet.drop_volumes_since(before)
                raise

    def start(self, result: Result, keep_on_failure: bool = False, door_stays: bool = True) -> None:
        """The group's services in order, ready at its first real completion; on failure its
        logs saved and the group taken down again (the front door kept when `door_stays`: an
        upgrade's old group starts again behind it), unless `keep_on_failure`."""
        fleet = self.fleet
        try:
            self._start(result)
        except (VllmComposeError, DockerException) as e:
            fleet.report(f"failed: {reason(e)}")  # the cause now, not after the rollback
            if not keep_on_failure:
                start: dict[str, object] = {"phases": dict(result.phases), "failed": reason(e)}
                self.take_down("rolling back", "rolled back", start, door_stays)
            raise
        c = fleet.cluster
        result.endpoint = f"http://{c.head.ip}:{c.vllm.port}/v1"
        evidence.last_start(self.logs, {"phases": dict(result.phases)})

    def take_down(
        self, doing: str, done: str, start: dict[str, object] | None = None, door_stays: bool = True
    ) -> None:
        """The group's diagnostics bundle saved (with `start`: how its start went), then its
        containers removed on every node, the front door's unless `door_stays` (volumes kept)."""
        if start is not None:
            evidence.last_start(self.logs, start)
        evidence.write_bundle(self.fleet, self.logs, doing)
        self.fleet.report(f"{doing}: taking the group down on every node")
        gone = door.group_down(self.fleet) if door_stays else self.fleet.down(volumes=False)
        for node, outcome in gone.items():
            self.fleet.report(f"{done} on {node}: {outcome}")

    def _images(self) -> dict[str, str]:
        try:
            return self.fleet.images()
        except DockerError as e:
            raise PhaseError(e.node, "image", e.what, e.detail) from None

    def _secrets(self, ours: set[str]) -> None:
        """The secret files onto the nodes. A running service started before one of its secrets
        last changed on its node (a rotated key, whichever command wrote it there) is removed:
        the start below recreates it with the new one, and reloads the front door (door.opened:
        it reads its keys again). `ours`: the nodes where this stack has containers (no other
        has a service to restart)."""
        changed = self.fleet.push_secrets()

        def stale(node: Node) -> Callable[[], None]:
            def run() -> None:
                states, changed_at = self.fleet.states(node), changed.get(node.name, {})
                for service in reversed(self.fleet.stacks[node.name].services):  # serve first
                    state = states.get(service.name)
                    if not (state and state.running and state.started_at):
                        continue
                    door_on = self.fleet.cluster.front_door.enabled
                    newer = secrets.newer(service.secrets, state.started_at, changed_at, door_on)
                    if newer:
                        said = f"{', '.join(newer)} changed since {service.name} started"
                        self.fleet.report(f"secrets: {node.name}: {said}; it restarts with it")
                        self.fleet.remove(node, service.name)

            return run

        nodes = [n for n in self.fleet.cluster.nodes if changed.get(n.name) and n.name in ours]
        parallel("secrets", {n.name: stale(n) for n in nodes}, DOWN_TIMEOUT, self.fleet.report)

    def _preflight(self, others: dict[str, list[claims.Claim]]) -> None:
        preflight.must_pass(self.fleet, others, self.locked, self.lock_file, self.stamped)

    def _start(self, result: Result) -> None:
        c, stacks = self.fleet.cluster, self.fleet.stacks
        if c.front_door.enabled:  # first, and left running: it holds requests while serve starts
            self._phase(result, "front door", lambda: door.opened(self.fleet, self._started))
        if c.metrics:  # first: the exporters see the start too
            sidecars = {n: [s.name for s in stacks[n.name].sidecars] for n in c.nodes}
            self._phase(result, "metrics", lambda: self._started("metrics", sidecars))
        if c.backend == "ray":
            # Every node's Ray and serve at once, as vLLM's run_cluster.sh: vLLM loads while Ray
            # starts, then waits for the workers; `_serve_up` names one that did not join in time.
            ray = {n: ["ray", "serve"] if n == c.head else ["ray"] for n in c.nodes}
            self._phase(result, "ray", lambda: self._started("ray", ray, self.timeouts.ray))
        else:  # the headless ranks, at once (rank 0 waits for them)
            ranks = {n: ["serve"] for n in c.workers}
            self._phase(result, "ranks", lambda: self._started("ranks", ranks))
        serve_timeout = self.timeouts.serve or c.vllm.startup_timeout
        self._phase(result, "serve", lambda: self._serve_up(serve_timeout))

    def _phase(self, result: Result, name: str, fn: Callable[[], object]) -> None:
        self.fleet.report(f"{name} ...")
        start = time.monotonic()
        fn()
        result.phases.append((name, time.monotonic() - start))

    def _started(
        self, phase: str, services: dict[Node, list[str]], timeout: float = START_TIMEOUT
    ) -> None:
        """Each node's services started, all nodes at once (Compose returns once created); a
        node whose Compose fails is named with the cause from its log."""

        def start(node: Node) -> Callable[[], None]:
            def run() -> None:
                try:
                    self.fleet.compose_up(node, services[node])
                except DockerException as e:
                    raise readiness.failure(self.fleet, node, phase, reason(e)) from None

            return run

        if services:
            parallel(phase, {n.name: start(n) for n in services}, timeout, self.fleet.report)

    def _serve_up(self, timeout: int) -> None:
        """Start serve (with Ray it started beside the head's Ray) and follow its log; probe it
        with the same real completion its healthcheck sends as soon as the server says it
        started, and every few seconds anyway. Waiting on the healthcheck instead would add up to
        its interval to every start; polling faster would steal CPU from the model load.
        Meanwhile every other rank must keep running, and with Ray every node must have joined
        within the join timeout."""
        fleet, head, c = self.fleet, self.fleet.head, self.fleet.cluster
        if c.backend == "ray":
            others = [(n, "ray") for n in c.nodes]
            join = readiness.Join(self.timeouts.join)
        else:  # a headless rank that dies leaves rank 0 waiting for it
            self._started("serve", {head: ["serve"]})
            others, join = [(n, "serve") for n in c.workers], None
        watched = readiness.Watched(fleet, head, "serve", "serve", others, join)
        readiness.wait(watched, probes.serve(ports.vllm(c), c.served_model_name), timeout, True)

    # watch's view of the group (generator/operations/watch.py)

    def problems(self, deadline: float) -> list[str]:
        return observe.problems(self.fleet, deadline)

    def sidecars(self) -> set[str]:
        return {s.name for stack in self.fleet.stacks.values() for s in stack.sidecars}

    def sidecars_down(self) -> dict[str, list[str]]:
        return observe.sidecars_down(self.fleet)

    def heat(self) -> dict[str, Reading]:
        return observe.heat(self.fleet)

    @contextlib.contextmanager
    def following(self) -> Iterator[None]:
        """Every node's container events followed while inside (`signs` reads them)."""
        with events.Follower(self.fleet) as self.follower:
            yield
        self.follower = None

    def signs(self, timeout: float) -> list[events.Sign]:
        """The events that say a container broke, within `timeout` s (a pause without them)."""
        if self.follower is None:
            time.sleep(timeout)
            return []
        return self.follower.next(timeout)

    def quiet(self) -> None:
        """The events seen so far dropped: what a recovery or a heal did is not a fault."""
        if self.follower is not None:
            self.follower.drain()

    def down(self) -> dict[str, str]:
        """watch giving up: the logs saved first, the containers removed, the volumes (the head's
        /tmp holds Ray's session logs) and the front door (it answers 503) kept until `down`."""
        evidence.write_bundle(self.fleet, self.logs, "giving up")
        return {n: f"{what}, volumes kept" for n, what in door.group_down(self.fleet).items()}

    def start_again(self, services: dict[str, list[str]]) -> None:
        """The named services, and those in their process namespace (Ray's serve: its exit may not
        be in the signs yet), started again as they were; the supervisors re-form the group. A
        front door among them is then asked as a client would (door.answers)."""
        nodes, started = {n.name: n for n in self.fleet.cluster.nodes}, {}
        for name, names in services.items():
            if beside := sharing(self.fleet.stacks[name].services, names):
                self.fleet.report(f"watch: {name}'s {', '.join(beside)} too: in its namespace")
            started[nodes[name]] = [*names, *beside]
        self.fleet.contexts_answer()  # an engine that went away is named as such
        for node, names in started.items():
            self.fleet.ended(node, names)
        self._started("start again", started)
        if door.NAME in services.get(self.fleet.head.name, []):
            door.answers(self.fleet)

    def recreate(self) -> Result:
        """The whole group again: its logs saved; serve, the workers, then the head down (volumes
        kept: the head's /tmp holds each try's Ray logs, named afresh); `up`, preflight included."""
        fleet, head = self.fleet, self.fleet.head
        evidence.write_bundle(fleet, self.logs, "recreate")
        fleet.report("recreate: taking serve, then the workers, then the head down")
        serve = each({head.name: lambda: fleet.remove(head, "serve")}, DOWN_TIMEOUT)[head.name]
        if isinstance(serve, BaseException):
            fleet.report(f"recreate: {head.name}: serve not removed: {reason(serve)}")
        for step in (fleet.cluster.workers, [head]):
            for node, what in door.group_down(fleet, step).items():
                if not what.startswith("removed"):
                    fleet.report(f"recreate: {node}: {what}")
        return self.up(door_stays=True)
