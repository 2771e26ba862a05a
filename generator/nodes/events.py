"""Every node's container events for one cluster, as the engines send them: what `watch` acts on
between its checks, within a second of a container dying, being killed, stopped, removed or
turning unhealthy, instead of at its next check.

A cut link or a hung rank sends no container event, but the group's supervisors (image/group.py)
see it within a second and say so in their container's log: a peer that stopped answering, a
group that broke (a peer silent for the group's grace, a peer started again, the head's canary
failing). Each running container of the group has its log followed too (`docker logs -f`, started
again with each start event), and those lines are signs as well.

One `docker events` per node, over the node's context, filtered to the cluster's Compose project
(python-on-whales streams events but cannot end the stream; so, as `Fleet.follow`, this is a
process of its own, ended on leaving). A stream that ends means the node's engine went away (a
power cut, a stopped engine): that is a sign too, and the stream is started again until the
engine answers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import queue
import subprocess
import threading
import time
from typing import IO

from python_on_whales import DockerException

from generator.base.containers import SERVICE, service_of
from generator.nodes.fleet import Fleet

RESTART = 2.0  # seconds before a node's ended stream is started again
GATHER = 0.5  # seconds to wait for the rest of one fault's events (a kill, then its die)
# Actions that say a container is no longer what the group runs on.
BREAKING = ("die", "kill", "oom", "stop", "destroy", "health_status: unhealthy")
MANUAL = ("kill", "stop", "destroy")  # through the engine: Docker will not start it again
# The supervisors' lines (image/group.py has the same words), and the actions they become.
SUPERVISOR = "vllm-compose: "
SAID = {"stopped answering": "silent", "the group broke:": "broke"}
RESTARTED = ("die", "oom", "gone")  # Docker starts these again by itself (a stack with its engine)
HEALING = (*RESTARTED, "silent", "broke")  # Docker or the supervisors act on these


@dataclasses.dataclass(frozen=True)
class Sign:
    """One event of one service's container on one node; `action` "gone" for a lost stream."""

    node: str
    service: str
    action: str
    container: str = ""
    exit_code: int | None = None
    signal: int | None = None
    manual: bool = False  # the container was killed or stopped through its engine before
    detail: str = ""  # a supervisor's own words, for "silent" and "broke"

    def said(self) -> str:
        """What happened, for watch's line: "ray exited (exit 137)", "serve removed", ..."""
        words = {
            "die": f"exited (exit {self.exit_code})",
            "kill": f"sent signal {self.signal} through its engine (docker kill or stop)",
            "oom": "ran out of memory",
            "stop": "stopped through its engine",
            "destroy": "removed",
            "health_status: unhealthy": "turned unhealthy",
            "gone": "its engine's event stream ended: the engine or the node went away",
            "silent": f"its supervisor: {self.detail}",
            "broke": f"its supervisor: the group broke ({self.detail})",
        }
        what = words.get(self.action, self.action)
        return (
            f"{self.node}: {what}"
            if self.action == "gone"
            else f"{self.node}: {self.service} {what}"
        )


def parse(node: str, line: str) -> Sign | None:
    """One line of `docker events --format '{{json .}}'`; None for what is not a container's."""
    try:
        event = json.loads(line)
    except ValueError:
        return None
    if not isinstance(event, dict) or event.get("Type") != "container":
        return None
    actor = event.get("Actor") or {}
    found = actor.get("Attributes") or {}
    return Sign(
        node=node,
        service=str(found.get(SERVICE, found.get("name", "?"))),
        action=str(event.get("Action") or event.get("status") or ""),
        container=str(actor.get("ID") or event.get("id") or ""),
        exit_code=_number(found.get("exitCode")),
        signal=_number(found.get("signal")),
    )


def supervisor(node: str, service: str, line: str) -> Sign | None:
    """A supervisor's line from a container's log as a sign; None for any other line."""
    _, found, message = line.partition(SUPERVISOR)
    for words, action in SAID.items() if found else ():
        if words in message:
            detail = message.split(words, 1)[1] if action == "broke" else message
            return Sign(node, service, action, detail=detail.split(";")[0].strip())
    return None


def _number(text: object) -> int | None:
    try:
        return int(str(text))
    except ValueError:
        return None


def heals(signs: list[Sign]) -> bool:
    """Does Docker bring these containers back by itself? A container that exited is started
    again by its restart policy (unless-stopped), an OOM kill included, and a node's whole stack
    with its engine (a reboot, a power cut: the stacks restart with their node). One killed or
    stopped through its engine (docker kill, docker stop) or removed is not; nor is an
    unhealthy one (Docker's restart policies do not act on health). A peer silent or a group
    broken, as a supervisor says, the supervisors mend themselves."""
    broken = [s for s in signs if s.action in BREAKING or s.action in HEALING]
    manual = {s.container for s in signs if s.action in MANUAL}
    return bool(broken) and all(
        s.action in HEALING and not s.manual and s.container not in manual for s in broken
    )


def started_again(signs: list[Sign]) -> dict[str, list[str]]:
    """node -> the services to start again as they were, where a container these signs broke was
    killed, stopped or removed through its engine (the engine is there: Compose starts it again,
    or creates it anew), with any that exited beside it (a serve in its Ray container's process
    namespace dies with it); {} where none was (Docker starts what exited by itself) or where one
    turned unhealthy or an engine went away, which this does not mend."""
    broken = [s for s in signs if s.action in BREAKING or s.action == "gone"]
    manual = {s.container for s in signs if s.action in MANUAL}
    through_engine = any(s.action in MANUAL or s.manual or s.container in manual for s in broken)
    if not through_engine or any(s.action in ("health_status: unhealthy", "gone") for s in broken):
        return {}
    found: dict[str, list[str]] = {}
    for s in broken:
        if s.service not in found.setdefault(s.node, []):
            found[s.node].append(s.service)
    return found


class Follower:
    """The signs of every node of a fleet's cluster, merged; a context manager."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.signs: queue.Queue[Sign] = queue.Queue()
        self.processes: dict[str, subprocess.Popen[str]] = {}
        self.lock = threading.Lock()
        self.closed = threading.Event()
        # Containers killed or stopped through their engine: a `docker stop` says kill (SIGTERM)
        # first, and its die comes up to the grace period later, in a later batch of signs.
        self.manual: set[str] = set()
        self.tails: dict[str, subprocess.Popen[str]] = {}  # container ID -> its log followed

    def __enter__(self) -> Follower:
        self.threads = [
            threading.Thread(target=self._follow, args=(node.name,), daemon=True)
            for node in self.fleet.cluster.nodes
        ]
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.closed.set()
        with self.lock:
            for process in [*self.processes.values(), *self.tails.values()]:
                process.terminate()
        for thread in self.threads:
            thread.join(timeout=5)

    def next(self, timeout: float) -> list[Sign]:
        """The signs that arrive within `timeout` s: the first, and what follows it within
        GATHER s (one fault's events come together); [] when none came."""
        try:
            found = [self.signs.get(timeout=max(timeout, 0.01))]
        except queue.Empty:
            return []
        end = time.monotonic() + GATHER
        while (left := end - time.monotonic()) > 0:
            try:
                found.append(self.signs.get(timeout=left))
            except queue.Empty:
                break
        return found

    def drain(self) -> None:
        while True:
            try:
                self.signs.get_nowait()
            except queue.Empty:
                return

    def _docker(self, node: str) -> list[str]:
        """The `docker` command line that reaches `node`'s engine (its context)."""
        return [*map(str, self.fleet.docker[node].client_config.docker_cmd)]

    def _follow(self, node: str) -> None:
        project = f"label=com.docker.compose.project={self.fleet.cluster.name}"
        cmd = [*self._docker(node), "events", "--format", "{{json .}}"]
        cmd += ["--filter", "type=container", "--filter", project]
        # Not one-off containers (preflight's, `top`'s looks): theirs are not the group's.
        cmd += ["--filter", "label=com.docker.compose.oneoff=False"]
        while not self.closed.is_set():
            started = time.monotonic()
            with self.lock:
                if self.closed.is_set():
                    return
                process = subprocess.Popen(
                    cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
                )
                self.processes[node] = process
            self._tail_running(node)
            assert process.stdout is not None
            with process.stdout:
                self._read(node, process.stdout)
            process.wait()
            if self.closed.is_set():
                return
            # A stream that ran a while and ended: its engine went away. One that fails at once
            # (the engine still away) is tried again quietly.
            if time.monotonic() - started > RESTART:
                self.signs.put(Sign(node, "", "gone"))
            self.closed.wait(RESTART)

    def _read(self, node: str, stream: IO[str]) -> None:
        for line in stream:
            sign = parse(node, line)
            if sign is not None and sign.action == "start":
                self._tail(node, sign.container, sign.service, _since(line))
            if sign is None or sign.action not in BREAKING:
                continue
            if sign.action in MANUAL:
                self.manual.add(sign.container)
            elif sign.container in self.manual:
                sign = dataclasses.replace(sign, manual=True)
            self.signs.put(sign)

    def _tail_running(self, node: str) -> None:
        """Follow the log of each of the cluster's containers running on `node` from now on."""
        project = f"com.docker.compose.project={self.fleet.cluster.name}"
        try:
            running = self.fleet.docker[node].container.list(
                filters=[("label", project), ("label", "com.docker.compose.oneoff=False")]
            )
        except DockerException:
            return  # its engine is away: the start events bring them when it is back
        for container in running:
            self._tail(node, container.id, service_of(container), None)

    def _tail(self, node: str, container: str, service: str, since: str | None) -> None:
        """Follow one container's log (from `since`, else from now) in a thread of its own,
        until the container stops; its supervisor's lines become signs."""
        since_args = ["--since", since] if since else ["--tail", "0"]
        cmd = [*self._docker(node), "logs", "-f", *since_args, container]
        with self.lock:
            self.tails = {c: p for c, p in self.tails.items() if p.poll() is None}
            running = self.tails.get(container)
            if self.closed.is_set() or (running is not None and since is None):
                return
            if running is not None:  # started again before its old follower saw it stop
                running.terminate()
            process = subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
            )
            self.tails[container] = process
        threading.Thread(target=self._said, args=(node, service, process), daemon=True).start()

    def _said(self, node: str, service: str, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        with process.stdout:
            for line in process.stdout:
                if sign := supervisor(node, service, line):
                    self.signs.put(sign)
        process.wait()


def _since(line: str) -> str | None:
    """An event's time, as `docker logs --since` takes it (the engine's own clock)."""
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        nanos = int(json.loads(line).get("timeNano"))
        return f"{nanos // 10**9}.{nanos % 10**9:09d}"
    return None
