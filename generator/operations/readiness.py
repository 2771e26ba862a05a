"""Is a service ready: its probe run in its container until it passes, its log followed for the
line that says the server started (then probed every second) and for lines that mean it never
will; and when not, why, read from the failing service's health output and log."""

from __future__ import annotations

import contextlib
import json
import queue
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial

from python_on_whales import DockerException

from generator.base import probes, startlog
from generator.base.errors import PhaseError, reason
from generator.base.fanout import each
from generator.config import Cluster, Node, ports
from generator.nodes.fleet import Fleet
from generator.operations import diagnose

LOG_TAIL = 20
PROBE_EVERY = 15  # seconds between probes until the log says the server started
RUNNING_TIMEOUT = 30  # asking a node whether a rank still runs
STARTED = "Application startup complete"  # uvicorn's line once vLLM's API listens
DIAGNOSE_LINES = 2000  # how much of a failed service's log is searched for its cause
CANARY_GRACE = 30  # a canary that has not come back by its deadline plus this has failed
PROGRESS_SECONDS = 2  # between the two looks at vLLM's /metrics after a late canary
NOT_READY_EVERY = 5  # seconds between "not ready" lines while the log names no phase
STILL_EVERY = 30  # seconds between "still in this phase" lines once it does


def failure(
    fleet: Fleet,
    node: Node,
    phase: str,
    message: str,
    hint: str | None = None,
    seen: str = "",
    service: str | None = None,
) -> PhaseError:
    """A PhaseError with the cause read from the failing service's log (`service`, or the node's
    first not running or not healthy), its last health output and its last log lines. `seen`:
    the log line that tripped a guard."""
    detail = f"log line: {seen}\n" if seen else ""
    failing = (service, "") if service else None if seen else fleet.failing_service(node)
    if failing:
        service, check = failing
        log = fleet.tail(node, service, DIAGNOSE_LINES)
        found = diagnose.cause(log)
        message += f": {found}" if found else ""
        detail += f"health check: {check}\n" if check else ""
        tail = "\n".join(log.splitlines()[-LOG_TAIL:])
        detail += f"last lines of {service} on {node.name}:\n{tail}"
    return PhaseError(node.name, phase, message, detail, hint)


@dataclass
class Join:
    """Every node's Ray in the head's GCS `seconds` after the start (vLLM waits for them in its
    placement group meanwhile): asked of the GCS at that deadline, or when vLLM says it waits."""

    seconds: float
    deadline: float = 0.0
    done: bool = False

    def __post_init__(self) -> None:
        self.deadline = time.monotonic() + self.seconds


@dataclass
class Watched:
    """What `wait` knows while it waits."""

    fleet: Fleet
    node: Node
    service: str
    phase: str
    others: list[tuple[Node, str]] = field(default_factory=list)  # (node, service) that must run
    join: Join | None = None
    started: bool = False
    last: str = "not probed yet"
    trackers: dict[str, startlog.Tracker] = field(default_factory=dict)  # node -> its phases
    began: float = field(default_factory=time.monotonic)

    @property
    def phases(self) -> startlog.Tracker:
        """The followed node's phases."""
        return self.trackers.setdefault(self.node.name, startlog.Tracker())

    def track(self, node: Node, line: str) -> None:
        """Say the phase a node's line begins: one of the followed log's (a Ray worker's line
        there names its node), or of another node's own log (a native rank's)."""
        ip = startlog.origin(line)
        node = next((n for n in self.fleet.cluster.nodes if str(n.ip) == ip), node)
        tracker = self.trackers.setdefault(node.name, startlog.Tracker())
        if seen := tracker.advance(line, time.monotonic()):
            took = time.monotonic() - self.began
            said = f"{self.phase}: {node.name}: {seen} ({took:.0f} s)"
            self.fleet.report(startlog.PhaseLine(said, self.phase, node.name, seen))

    def probe(self, probe: list[str]) -> bool:
        try:
            self.fleet.execute(self.node, self.service, probe)
            return True
        except DockerException as e:
            self.last = reason(e).removeprefix(f"{probes.HEALTH}: ")
        # Every rank at once: one CLI call each, while the group may still be starting.
        ranks = [(self.node, self.service), *self.others]
        work: dict[str, Callable[[], bool]]
        work = {f"{n.name}/{s}": partial(self.fleet.running, n, s) for n, s in ranks}
        seen = each(work, RUNNING_TIMEOUT)
        for other, service in ranks:
            if isinstance(outcome := seen[f"{other.name}/{service}"], BaseException):
                raise outcome
            if outcome is False:
                phase = self.phase if service == self.service else service
                raise failure(self.fleet, other, phase, f"{service} stopped", service=service)
        return False

    def joined(self, now: bool = False) -> bool:
        """Has every node's Ray joined? Asked of the head's GCS at the join deadline, or `now`.
        Not by the deadline is a failure naming the first node missing."""
        join = self.join
        if join is None or join.done:
            return True
        if not now and time.monotonic() < join.deadline:
            return False
        fleet, c = self.fleet, self.fleet.cluster
        missing: list[Node] = []
        try:
            alive = json.loads(fleet.execute(self.node, "ray", probes.nodes(fleet.gcs)))
            missing = [n for n in c.nodes if str(n.ip) not in alive]
            seen = ", ".join(sorted(alive)) or "none"
            said = f"Ray nodes missing: {', '.join(str(n.ip) for n in missing)} (alive: {seen})"
        except (DockerException, ValueError) as e:
            said = reason(e).removeprefix(f"{probes.HEALTH}: ")
            missing = [self.node]
        join.done = not missing
        if missing and time.monotonic() >= join.deadline:
            message = f"not in Ray {join.seconds:g} s after the start: {said}"
            raise failure(fleet, missing[0], "ray-join", message)
        return join.done

    def read(self, line: str | None) -> None:
        """One line of the followed log (None: it ended, the container stopped)."""
        if line is not None:
            self.track(self.node, line)
        if line is None or STARTED in line:
            self.started = True
        elif probes.EXITED in (probes.supervisor_said(line) or ""):
            raise failure(
                self.fleet, self.node, self.phase, f"{self.service} stopped", service=self.service
            )
        elif tripped := diagnose.guard(line):
            cause = None
            if tripped is diagnose.PLACEMENT:
                if not self.joined(now=True):
                    return  # a node still joining: the join deadline judges it
                slots = self.fleet.gpu_slots()
                if slots is not None and diagnose.group_placed(self.fleet.cluster, slots):
                    return  # made since vLLM said it waits
                cause = placement_cause(self.fleet.cluster, slots)
            raise failure(
                self.fleet,
                self.node,
                self.phase,
                cause or tripped.cause,
                tripped.hint,
                line.strip(),
            )


def wait(watched: Watched, probe: list[str], limit: float, follow: bool = False) -> None:
    """Run `probe` in the service's container until it passes: every PROBE_EVERY seconds, and
    every second once the followed log says the server started. Fails at once when the
    container stops, with the cause from its log."""
    fleet, node = watched.fleet, watched.node
    watched.started = not follow
    # The other ranks of the same service (the native backend's) are followed for their phases.
    ranks = [n for n, service in watched.others if follow and service == watched.service]
    with contextlib.ExitStack() as stack:
        lines = stack.enter_context(fleet.follow(node, watched.service)) if follow else None
        theirs = [(n, stack.enter_context(fleet.follow(n, watched.service))) for n in ranks]
        _wait(watched, probe, limit, lines, theirs)


def _wait(
    watched: Watched,
    probe: list[str],
    limit: float,
    lines: queue.Queue[str | None] | None,
    theirs: list[tuple[Node, queue.Queue[str | None]]],
) -> None:
    """`wait` with its logs open: `lines` the followed service's, `theirs` the other ranks'."""
    fleet, node = watched.fleet, watched.node
    start = reported = time.monotonic()
    # The first probe once the log says the server started (a running one's log says so at
    # once), else after PROBE_EVERY: a probe of a server still starting only costs its CPU.
    probed = start if lines is not None else start - PROBE_EVERY
    while True:
        now = time.monotonic()
        if now - probed >= (1 if watched.started else PROBE_EVERY):
            probed = now
            if watched.probe(probe):
                return
        watched.joined()
        if now - start > limit:
            message = f"not ready after {limit:g} s: {watched.last}"
            raise failure(fleet, node, watched.phase, message)
        if now - max(reported, watched.phases.since) >= _every(watched):
            fleet.report(_waiting(watched, now - start))
            reported = now
        _read_a_second(watched, lines)
        for rank, said in theirs:
            while not said.empty():
                if (line := said.get_nowait()) is not None:
                    watched.track(rank, line)


def _every(watched: Watched) -> float:
    return NOT_READY_EVERY if watched.phases.now is None else STILL_EVERY


def _waiting(watched: Watched, elapsed: float) -> str:
    """What a wait says while nothing new happens: the phase the log is in, else the probe's."""
    said, now = f"{watched.phase}: {watched.node.name}", watched.phases.now
    if now is None:
        return f"{said} not ready ({elapsed:.0f} s): {watched.last}"
    took = time.monotonic() - watched.phases.since
    still = f"{said}: still {now} after {took:.0f} s ({elapsed:.0f} s in all)"
    return startlog.PhaseLine(still, watched.phase, watched.node.name, now)


def _read_a_second(watched: Watched, lines: queue.Queue[str | None] | None) -> None:
    """The followed log's lines for up to a second (each checked against the guards), or a
    second's sleep when there is no log to follow; back early once the server has started."""
    deadline = time.monotonic() + 1
    while (left := deadline - time.monotonic()) > 0:
        if lines is None:
            time.sleep(left)
            return
        try:
            line = lines.get(timeout=left)
        except queue.Empty:
            return
        was_started = watched.started
        watched.read(line)
        if line is None:
            lines = None
        elif watched.started and not was_started:
            return


def canary(fleet: Fleet, deadline: float) -> list[str]:
    """One real completion inside serve, as its healthcheck sends, within `deadline`. Late while
    vLLM is making progress (requests running, tokens rising) is busy, not broken: said, and no
    problem."""
    head, c = fleet.head, fleet.cluster
    probe = probes.serve(ports.vllm(c), c.served_model_name, deadline)
    run = lambda: fleet.execute(head, "serve", probe)  # noqa: E731
    outcome = each({head.name: run}, deadline + CANARY_GRACE)[head.name]
    if not isinstance(outcome, BaseException):
        return []
    if busy := progress(fleet):
        fleet.report(f"watch: busy, not broken: the canary took over {deadline:g} s; {busy}")
        return []
    return [f"{head.name}: canary: {reason(outcome).removeprefix(f'{probes.HEALTH}: ')}"]


def progress(fleet: Fleet) -> str | None:
    """What vLLM's /metrics show when it is making progress: requests running and generated
    tokens rising over PROGRESS_SECONDS. None when it is not (or cannot say)."""
    probe = probes.metrics(ports.vllm(fleet.cluster))
    try:
        first = json.loads(fleet.execute(fleet.head, "serve", probe))
        time.sleep(PROGRESS_SECONDS)
        then = json.loads(fleet.execute(fleet.head, "serve", probe))
        gained = then["tokens"] - first["tokens"]
        running, waiting = then["running"], then["waiting"]
    except (DockerException, ValueError, KeyError, TypeError):
        return None
    if running <= 0 or gained <= 0:
        return None
    return f"{running:g} running, {waiting:g} waiting, +{gained:g} tokens in {PROGRESS_SECONDS:g} s"


def placement_cause(
    cluster: Cluster, slots: Mapping[str, Mapping[str, float]] | None
) -> str | None:
    """Which node keeps Ray from placing vLLM's workers, from every node's GPU slots
    (Fleet.gpu_slots)."""
    short = diagnose.placement_shortfall(cluster, slots) if slots is not None else []
    if not short:
        return None
    return f"Ray cannot place vLLM's workers: {'; '.join(short)} (vLLM would wait 1800 s)"
