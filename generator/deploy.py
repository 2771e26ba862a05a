"""Bring a cluster up, down, and look at it, over each node's Docker context (python-on-whales);
and the node-side work of `preflight`, `lock` and `sync-model`.

up: contexts answer -> (with a lock: no node holds another image) -> wrapper image on every node
    -> secrets -> preflight -> the head's Ray -> the workers' Ray (parallel) -> serve, ready at
    its first real completion. Each phase has its own timeout and is timed; a start phase that
    fails takes the group down again.
watch (generator/watch.py decides when): `problems` checks the running group, `recreate` takes
    it down in order and runs `up` again.
"""

from __future__ import annotations

import contextlib
import json
import queue
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from python_on_whales import DockerClient, DockerException

from generator import diagnose, images, lock, preflight, secrets, sync
from generator.config import Cluster, Node
from generator.errors import (
    DockerError,
    DriftError,
    PhaseError,
    PreflightError,
    VllmComposeError,
)
from generator.fanout import Report, last_line, parallel, settle
from generator.render import node_stacks, wrapper_tag
from generator.stack import model_mount

LOG_TAIL = 20
PROBE_EVERY = 15  # seconds between readiness probes until the log says the server started
STARTED = "Application startup complete"  # uvicorn's line once vLLM's API listens
DIAGNOSE_LINES = 2000  # how much of a failed service's log is searched for its cause
DOWN_TIMEOUT = 120  # per node: stop (30 s grace per service) and remove
SERVICE = "com.docker.compose.service"  # the label naming a container's service
HEALTH_LINES = 3  # of a failing health check's output, shown in the error
STATE_TIMEOUT = 30  # per node: an engine that does not list its containers by then is down


@dataclass(frozen=True)
class Timeouts:
    contexts: int = 30
    ray_head: int = 120
    join: int = 300  # workers' Ray joining the head
    serve: int | None = None  # default: the config's vllm.startup_timeout


@dataclass
class Result:
    phases: list[tuple[str, float]] = field(default_factory=list)
    images: dict[str, str] = field(default_factory=dict)
    endpoint: str = ""


def client(cluster: Cluster, node: Node, outdir: Path) -> DockerClient:
    """The node's engine over its context; Compose reads contexts.env, which points the stack's
    secrets at the files `up` writes on the node."""
    return DockerClient(
        context=node.docker_context,
        compose_files=[outdir / node.name / "compose.yaml"],
        compose_env_files=[outdir / node.name / "contexts.env"],
        compose_project_name=cluster.name,
    )


class Deployment:
    def __init__(
        self,
        cluster: Cluster,
        outdir: Path,
        report: Report,
        locked: lock.Lock | None = None,
        lock_file: Path | None = None,
        accept_drift: bool = False,
        secret_files: dict[str, Path] | None = None,
    ) -> None:
        """`cluster` as rendered: with a lock, its image is the locked ID."""
        self.cluster = cluster
        self.outdir = outdir
        self.report = report
        self.locked = locked
        self.lock_file = lock_file or Path("cluster.lock.json")
        # Just re-locked: nodes holding another image under the ref get the locked one streamed.
        self.accept_drift = accept_drift
        self.secret_files = secret_files or {}
        self.docker = {n.name: client(cluster, n, outdir) for n in cluster.nodes}
        self.stacks = {s.node.name: s for s in node_stacks(cluster, "")}

    # up

    def up(
        self, timeouts: Timeouts = Timeouts(), checks: bool = True, keep_on_failure: bool = False
    ) -> Result:
        """A start phase that fails takes the whole group down again (a half-started group
        serves nothing and holds ports), unless `keep_on_failure`; the error names the cause."""
        result = Result()
        c = self.cluster
        self._phase(result, "contexts", lambda: self._contexts_answer(timeouts.contexts))
        if self.locked and not self.accept_drift:
            self._no_image_drift(self.locked)
        self._phase(result, "image", lambda: result.images.update(self._images(c.nodes)))
        self._phase(result, "secrets", self.push_secrets)
        if checks:
            self._phase(result, "preflight", self._preflight_passes)
        try:
            self._start(result, timeouts)
        except VllmComposeError as e:
            self.report(f"failed: {e.message}")  # the cause now, not after the rollback
            if not keep_on_failure:
                self.report("rolling back: taking the group down on every node")
                for node, outcome in self.down().items():
                    self.report(f"rolled back on {node}: {outcome}")
            raise
        result.endpoint = f"http://{c.head.ip}:{c.vllm.port}/v1"
        return result

    def _start(self, result: Result, timeouts: Timeouts) -> None:
        c = self.cluster
        if c.backend == "ray":
            self._phase(result, "ray-head", lambda: self._ray_head(timeouts.ray_head))
            self._phase(result, "ray-workers", lambda: self._workers_up(timeouts.join))
        else:
            self._phase(result, "ranks", lambda: self._workers_up(None))
        serve_timeout = timeouts.serve or c.vllm.startup_timeout
        self._phase(result, "serve", lambda: self._serve_up(serve_timeout))

    def _phase(self, result: Result, name: str, fn: Callable[[], object]) -> None:
        self.report(f"{name} ...")
        start = time.monotonic()
        fn()
        result.phases.append((name, time.monotonic() - start))

    def _contexts_answer(self, timeout: float) -> None:
        def probe(node: Node) -> Callable[[], None]:
            def run() -> None:
                try:
                    self.docker[node.name].system.info()
                except DockerException as e:
                    raise DockerError(
                        node.name,
                        f"context '{node.docker_context}' does not answer",
                        e.stderr or "",
                        hint=f"docker --context {node.docker_context} info",
                    ) from None

            return run

        parallel("contexts", {n.name: probe(n) for n in self.cluster.nodes}, timeout, self.report)

    def _images(self, nodes: list[Node]) -> dict[str, str]:
        targets = [images.Target(n.name, self.docker[n.name], self.outdir / n.name) for n in nodes]
        try:
            return images.distribute(
                targets, wrapper_tag(self.cluster), self.cluster.image, self.report
            )
        except DockerError as e:
            raise PhaseError(e.node, "image", e.message, e.detail) from None

    def secrets_onto_nodes(self) -> None:
        """As `up` does it, alone: for stacks started by hand."""
        self._contexts_answer(30)
        self._images(self.cluster.nodes)
        self.push_secrets()

    def push_secrets(self, nodes: list[Node] | None = None) -> None:
        """Each node's secret files, onto the node, all nodes (or those given) at once. Compose
        creates no container of a service whose secret file is missing, one-off ones (preflight's
        facts) included."""
        image = wrapper_tag(self.cluster)

        def push(node: Node) -> Callable[[], None]:
            used = self.stacks[node.name].used_secrets
            files = {n: p for n, p in self.secret_files.items() if n in used}
            return lambda: secrets.push(
                self.cluster, node.name, self.docker[node.name], image, files
            )

        work = {n.name: push(n) for n in nodes or self.cluster.nodes}
        parallel("secrets", work, 120, self.report)

    # preflight

    def preflight(self) -> tuple[list[preflight.Check], float]:
        """Every check, on every node whose context answers; and how long they took."""
        start = time.monotonic()
        checks = preflight.contexts(self.cluster, self.docker, self.report)
        alive = {c.node for c in checks if c.status == "pass"}
        live = [n for n in self.cluster.nodes if n.name in alive]
        if live:
            self._images(live)
            self.push_secrets(live)
        more, facts = preflight.gather(self.cluster, self.docker, live, self.report)
        checks += more + preflight.evaluate(self.cluster, facts, self._bases(live), self._serving())
        return checks, time.monotonic() - start

    def _preflight_passes(self) -> None:
        """Within up: the contexts answered and the image is everywhere; the rest must pass."""
        start = time.monotonic()
        nodes = self.cluster.nodes
        checks, facts = preflight.gather(self.cluster, self.docker, nodes, self.report)
        checks += preflight.evaluate(self.cluster, facts, self._bases(nodes), self._serving())
        failures = [c.line() for c in checks if c.status == "fail"]
        if failures:
            raise PreflightError(failures, time.monotonic() - start)
        if self.locked:
            drift = [
                line
                for node, found in facts.items()
                for line in lock.model_drift(self.locked, node, found["model"])
            ]
            if drift:
                raise DriftError(drift, self.lock_file)

    # lock

    def _no_image_drift(self, locked: lock.Lock) -> None:
        """A node whose engine holds another image under the locked ref has drifted."""
        drift = lock.image_drift(
            locked, self._image_ids(locked["image"]["ref"], self.cluster.nodes)
        )
        if drift:
            raise DriftError(drift, self.lock_file)

    def resolve(self) -> lock.Lock:
        """What the head resolves the config to now: its base image, the versions inside it and
        the model's manifest (every file hashed, on the head)."""
        head = self.cluster.head
        self._contexts_answer(30)
        self._images([head])
        self.push_secrets([head])
        base = self.docker[head.name].image.inspect(self.cluster.image)
        self.report(f"lock: hashing {self.cluster.model.path} on {head.name}")
        facts = self._health(
            head, ["facts", "--interface", "lo", "--ip", "127.0.0.1", "--listen", "0"]
        )
        manifest = self.manifest(head)
        digests = list(base.repo_digests)
        return lock.make(self.cluster, base.id, digests, facts["versions"], manifest)

    def manifest(self, node: Node) -> dict[str, Any]:
        """The model's manifest on a node: every file's size and sha256 (symlinks followed)."""
        mount = model_mount(self.cluster.model.path)
        try:
            out = self.docker[node.name].run(
                wrapper_tag(self.cluster),
                ["manifest", self.cluster.model.path],
                entrypoint="vllm-compose-health",
                remove=True,
                volumes=[(mount, mount, "ro")],
            )
        except DockerException as e:
            raise DockerError(node.name, f"manifest failed: {last_line(e.stderr)}") from None
        return dict(json.loads(str(out)))

    def sync_model(self, source: Node) -> dict[str, sync.Outcome]:
        """The model from `source` to every other node, verified against the lock's manifest
        when there is a lock, else against the source's, hashed first."""
        self._contexts_answer(30)
        self._images(self.cluster.nodes)
        if self.locked:
            # The lock's hashes are the truth: each receiver checks every file against them, so
            # the source is not read twice (a source that differs fails its receivers' checks).
            manifest = {"files": self.locked["model"]["files"]}
        else:
            self.report(f"sync-model: hashing {self.cluster.model.path} on {source.name}")
            manifest = self.manifest(source)
        image = wrapper_tag(self.cluster)
        return sync.sync(self.cluster, self.docker, source, manifest, image, self.report)

    def _health(self, node: Node, args: list[str]) -> Any:
        """`vllm-compose-health ARGS` in a one-off container of the node's first service; its
        JSON output."""
        service = self.stacks[node.name].services[0]
        try:
            out = self.docker[node.name].compose.run(
                service.name,
                args,
                entrypoint="vllm-compose-health",
                remove=True,
                dependencies=False,
                tty=False,
            )
        except DockerException as e:
            raise DockerError(node.name, f"{args[0]} failed: {last_line(e.stderr)}") from None
        return json.loads(str(out))

    def _bases(self, nodes: list[Node]) -> dict[str, str | None]:
        """node -> the ID of its base image, None where only the wrapper is there."""
        return self._image_ids(self.cluster.image, nodes)

    def _image_ids(self, ref: str, nodes: list[Node]) -> dict[str, str | None]:
        """node -> the ID its engine has under `ref`, None where it has none."""
        found: dict[str, str | None] = {}
        for node in nodes:
            try:
                found[node.name] = self.docker[node.name].image.inspect(ref).id
            except DockerException:
                found[node.name] = None
        return found

    def _serving(self) -> bool:
        head = self.cluster.head
        try:
            return self._running(head, "serve")
        except DockerException:
            return False

    def _ray_head(self, timeout: float) -> None:
        head = self.cluster.head
        self._compose_up(head, ["ray"], wait=None, phase="ray-head")
        gcs = f"{head.ip}:{self.cluster.ray.port}"
        probe = ["vllm-compose-health", "ray", "--address", gcs, "--expect", str(head.ip)]
        self._await(head, "ray", probe, timeout, "ray-head")

    def _workers_up(self, timeout: int | None) -> None:
        def start(node: Node) -> Callable[[], None]:
            def run() -> None:
                self._compose_up(node, None, wait=timeout, phase="ray-workers")
                # Compose's --wait was seen returning 0 with the worker still "starting" (its
                # link cut): its word is checked.
                if timeout is not None and self._failing_service(node):
                    self._raise_failed(node, "ray-workers", f"not healthy after {timeout} s")

            return run

        work = {n.name: start(n) for n in self.cluster.workers}
        if work:
            parallel(
                "ray-workers" if timeout else "ranks", work, (timeout or 120) + 30, self.report
            )

    def _serve_up(self, timeout: int) -> None:
        """Start serve (Compose holds it behind its gates) and follow its log; probe it with the
        same real completion its healthcheck sends as soon as the server says it started, and every
        few seconds anyway. Waiting on the healthcheck instead would add up to its interval to
        every start; polling faster would steal CPU from the model load."""
        head = self.cluster.head
        # Compose holds serve back until the head's Ray is healthy: bounded by the same timeout.
        start = lambda: self._compose_up(head, ["serve"], wait=None, phase="serve")  # noqa: E731
        parallel("serve", {head.name: start}, timeout, self.report)
        # Native: a headless rank that dies leaves rank 0 waiting for it; watch them too.
        ranks = self.cluster.workers if self.cluster.backend == "native" else []
        probe = self._probe(head, "serve")
        self._await(head, "serve", probe, timeout, "serve", follow=True, ranks=ranks)

    def _probe(self, node: Node, service: str) -> list[str]:
        health = next(s.health for s in self.stacks[node.name].services if s.name == service)
        assert health is not None, f"{service} has no healthcheck"
        return health.test[1:]  # without "CMD"

    def _await(
        self,
        node: Node,
        service: str,
        probe: list[str],
        limit: float,
        phase: str,
        follow: bool = False,
        ranks: list[Node] | None = None,
    ) -> None:
        """Run `probe` in the service's container until it passes: every PROBE_EVERY seconds, and
        every second once the log (when followed) says the server started. Fails at once when the
        container stops, with the cause from its log."""
        docker, ranks = self.docker[node.name], ranks or []
        with self._follow(node, service) if follow else contextlib.nullcontext() as lines:
            start = reported = time.monotonic()
            probed, started, last = 0.0, lines is None, "not probed yet"
            while True:
                now = time.monotonic()
                if now - probed >= (1 if started else PROBE_EVERY):
                    probed = now
                    try:
                        docker.compose.execute(service, probe, tty=False)
                        return
                    except DockerException as e:
                        last = _reason(e).removeprefix("vllm-compose-health: ")
                    for other in [node, *ranks]:
                        if not self._running(other, service):
                            self._raise_failed(other, phase, f"{service} stopped")
                if now - start > limit:
                    self._raise_failed(node, phase, f"not ready after {limit:g} s: {last}")
                if now - reported >= 5:
                    self.report(f"{phase}: {node.name} not ready ({now - start:.0f} s): {last}")
                    reported = now
                if lines is None:
                    time.sleep(1)
                    continue
                try:
                    line = lines.get(timeout=1)
                except queue.Empty:
                    continue
                if line is None:  # the log ended: the container stopped
                    lines, started = None, True
                elif STARTED in line:
                    started = True
                elif tripped := diagnose.guard(line):
                    cause = self._placement_cause() if tripped is diagnose.PLACEMENT else None
                    cause = cause or tripped.cause
                    self._raise_failed(node, phase, cause, tripped.hint, line.strip())

    @contextlib.contextmanager
    def _follow(self, node: Node, service: str) -> Iterator[queue.Queue[str | None]]:
        """The service's log lines as they come, then None when it ends. The follower is ended
        on leaving: a `logs --follow` left behind would outlive the command."""
        lines: queue.Queue[str | None] = queue.Queue()
        cmd = [*self.docker[node.name].client_config.docker_compose_cmd, "logs", "--follow"]
        follower = subprocess.Popen(
            [*map(str, cmd), "--no-log-prefix", service],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )

        def pump() -> None:
            assert follower.stdout is not None
            for raw in follower.stdout:
                lines.put(raw.decode(errors="replace").rstrip("\n"))
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        try:
            yield lines
        finally:
            follower.terminate()
            follower.wait()

    def _running(self, node: Node, service: str) -> bool:
        found = self.docker[node.name].compose.ps([service], all=True)
        return bool(found) and found[0].state.running is True

    def _compose_up(
        self, node: Node, services: list[str] | None, wait: int | None, phase: str
    ) -> None:
        try:
            self.docker[node.name].compose.up(
                services,
                detach=True,
                wait=wait is not None,
                wait_timeout=wait,
                quiet=True,
                pull="never",
            )
        except DockerException as e:
            self._raise_failed(node, phase, last_line(e.stderr))

    def _raise_failed(
        self,
        node: Node,
        phase: str,
        message: str,
        hint: str | None = None,
        seen: str | None = None,
    ) -> NoReturn:
        """A PhaseError with the cause read from the failing service's log, its last health
        output and its last log lines. `seen`: the log line that tripped a guard."""
        detail = f"log line: {seen}\n" if seen else ""
        failing = None if seen else self._failing_service(node)
        if failing:
            service, check = failing
            log = self._tail(node, service, lines=DIAGNOSE_LINES)
            found = diagnose.cause(log)
            message += f": {found}" if found else ""
            detail += f"health check: {check}\n" if check else ""
            tail = "\n".join(log.splitlines()[-LOG_TAIL:])
            detail += f"last lines of {service} on {node.name}:\n{tail}"
        raise PhaseError(node.name, phase, message, detail, hint) from None

    def _failing_service(self, node: Node) -> tuple[str, str] | None:
        """The node's service that is not running or not healthy, with its last health output."""
        for container in self.docker[node.name].compose.ps(all=True):
            state = container.state
            health = state.health.status if state.health else None
            if not state.running or health == "unhealthy" or health == "starting":
                labels = container.config.labels or {}
                log = state.health.log if state.health and state.health.log else []
                # Its last lines: what the check said, after whatever the libraries logged.
                said = (log[-1].output or "").strip().splitlines() if log else []
                last = "\n".join(said[-HEALTH_LINES:])
                return labels.get(SERVICE, container.name), last
        return None

    def _tail(self, node: Node, service: str, lines: int = LOG_TAIL) -> str:
        try:
            return str(
                self.docker[node.name].compose.logs([service], tail=str(lines), no_log_prefix=True)
            )
        except DockerException as e:
            return f"(logs unavailable: {last_line(e.stderr)})"

    # down

    def down(self, nodes: list[Node] | None = None) -> dict[str, str]:
        """Every node (or those given) in parallel; node -> 'removed' or why it is not clean."""

        def one(node: Node) -> Callable[[], object]:
            return lambda: self.docker[node.name].compose.down(
                remove_orphans=True, volumes=True, quiet=True
            )

        chosen = self.cluster.nodes if nodes is None else nodes
        outcome = settle({n.name: one(n) for n in chosen}, DOWN_TIMEOUT)
        return {name: _outcome(found) for name, found in outcome.items()}

    # watch

    def problems(self, deadline: float) -> list[str]:
        """What is wrong with the running group, one line each; none when it serves: every
        service of every node running, every node alive in Ray at its IP, and a real completion
        back from serve within `deadline` seconds."""

        def states(node: Node) -> Callable[[], dict[str, Any]]:
            def run() -> dict[str, Any]:
                found = self.docker[node.name].compose.ps(all=True)
                return {(c.config.labels or {}).get(SERVICE, c.name): c.state for c in found}

            return run

        seen = settle({n.name: states(n) for n in self.cluster.nodes}, STATE_TIMEOUT)
        # An engine that does not answer first: it explains what is missing elsewhere.
        found = [
            f"{name}: engine does not answer: {_reason(state)}"
            for name, state in seen.items()
            if isinstance(state, BaseException)
        ]
        for node in self.cluster.nodes:
            state = seen[node.name]
            if isinstance(state, BaseException):
                continue
            for service in self.stacks[node.name].services:
                if service.name not in state:
                    found.append(f"{node.name}: {service.name} is not there")
                elif not state[service.name].running:
                    s = state[service.name]
                    found.append(f"{node.name}: {service.name} {s.status} (exit {s.exit_code})")
        if found:
            return found
        if self.cluster.backend == "ray":
            alive = self._ray_nodes()
            if alive is None:
                return [f"{self.cluster.head.name}: Ray's GCS does not answer"]
            found += [
                f"{n.name}: not alive in Ray at {n.ip}"
                for n in self.cluster.nodes
                if str(n.ip) not in alive
            ]
        return found + self._canary(deadline)

    def _canary(self, deadline: float) -> list[str]:
        """One real completion inside serve, as its healthcheck sends, within `deadline`."""
        head = self.cluster.head
        probe = [*self._probe(head, "serve"), "--timeout", f"{deadline:g}"]
        run = lambda: self.docker[head.name].compose.execute("serve", probe, tty=False)  # noqa: E731
        outcome = settle({head.name: run}, deadline + STATE_TIMEOUT)[head.name]
        if isinstance(outcome, BaseException):
            return [
                f"{head.name}: canary: {_reason(outcome).removeprefix('vllm-compose-health: ')}"
            ]
        return []

    def recreate(self, timeouts: Timeouts = Timeouts()) -> Result:
        """The whole group again: serve, then the workers, then the head down; then up as `up`
        does (head, workers, serve), preflight included."""
        head = self.cluster.head
        self.report("recreate: taking serve, then the workers, then the head down")
        rm = lambda: self.docker[head.name].compose.rm(["serve"], stop=True, volumes=True)  # noqa: E731
        serve = settle({head.name: rm}, DOWN_TIMEOUT)[head.name]
        if isinstance(serve, BaseException):
            self.report(f"recreate: {head.name}: serve not removed: {_reason(serve)}")
        for step in (self.cluster.workers, [head]):
            for node, what in self.down(step).items():
                if what != "removed":
                    self.report(f"recreate: {node}: {what}")
        return self.up(timeouts)

    # status and logs

    def status(self) -> list[dict[str, Any]]:
        alive = self._ray_nodes() if self.cluster.backend == "ray" else {}
        rows: list[dict[str, Any]] = []
        for node in self.cluster.nodes:
            row: dict[str, Any] = {"node": node.name, "ip": str(node.ip), "services": []}
            try:
                for container in self.docker[node.name].compose.ps(all=True):
                    state = container.state
                    labels = container.config.labels or {}
                    row["services"].append(
                        {
                            "service": labels.get(SERVICE),
                            "state": state.status,
                            "health": state.health.status if state.health else None,
                        }
                    )
            except DockerException as e:
                row["error"] = last_line(e.stderr)
            if self.cluster.backend == "ray":
                row["ray_alive_at_ip"] = str(node.ip) in alive if alive is not None else None
            rows.append(row)
        return rows

    def _placement_cause(self) -> str | None:
        """Which node keeps Ray from placing vLLM's workers, from every node's GPU slots."""
        head = self.cluster.head
        gcs = f"{head.ip}:{self.cluster.ray.port}"
        try:
            out = self.docker[head.name].compose.execute(
                "ray", ["vllm-compose-health", "slots", "--address", gcs], tty=False
            )
            short = diagnose.placement_shortfall(self.cluster, json.loads(out or "{}"))
        except (DockerException, ValueError):
            return None
        if not short:
            return None
        return f"Ray cannot place vLLM's workers: {'; '.join(short)} (vLLM would wait 1800 s)"

    def _ray_nodes(self) -> dict[str, float] | None:
        head = self.cluster.head
        gcs = f"{head.ip}:{self.cluster.ray.port}"
        try:
            out = self.docker[head.name].compose.execute(
                "ray", ["vllm-compose-health", "nodes", "--address", gcs], tty=False
            )
            return dict(json.loads(out or "{}"))
        except (DockerException, ValueError):
            return None

    def logs(self, node: str | None, follow: bool) -> Iterator[str]:
        """Lines of every node's services (or one node's), each prefixed by its node."""
        nodes = [n for n in self.cluster.nodes if node in (None, n.name)]
        lines: queue.Queue[str | None] = queue.Queue()

        def pump(n: Node) -> None:
            try:
                for _, chunk in self.docker[n.name].compose.logs(follow=follow, stream=True):
                    for line in chunk.decode(errors="replace").splitlines():
                        lines.put(f"{n.name} | {line}")
            except DockerException as e:
                lines.put(f"{n.name} | (logs unavailable: {last_line(e.stderr)})")
            finally:
                lines.put(None)

        for n in nodes:
            threading.Thread(target=pump, args=(n,), daemon=True).start()
        done = 0
        while done < len(nodes):
            line = lines.get()
            if line is None:
                done += 1
            else:
                yield line


def _reason(error: BaseException) -> str:
    if isinstance(error, DockerException):
        if (error.stderr or error.stdout or "").strip():
            return last_line(error.stderr or error.stdout)
        return f"exit code {error.return_code}, no output"
    return getattr(error, "message", None) or str(error) or type(error).__name__


def _outcome(found: object) -> str:
    return f"failed: {_reason(found)}" if isinstance(found, BaseException) else "removed"
