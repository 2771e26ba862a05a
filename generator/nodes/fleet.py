"""The node layer: every node of a cluster as Docker sees it, over the node's context.

One python-on-whales client per node, the node stacks computed once, the wrapper image's tag, and
the operations every command shares: contexts, images, secrets, one-off health runs, image IDs,
compose up/down, container states, log tails, Ray's view of the nodes. Every Docker call of the
tool goes through here or through the modules it hands a client to (images, secrets, sync).
"""

from __future__ import annotations

import contextlib
import json
import queue
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from pathlib import Path
from typing import Any, cast

from python_on_whales import Container, DockerClient, DockerException, Image, Volume
from python_on_whales.components.container.models import ContainerState

from generator.base import probes
from generator.base.containers import health_of, service_of
from generator.base.errors import DockerError, reason
from generator.base.fanout import Report, each, parallel, pump
from generator.config import Cluster, Node
from generator.config.mounts import model_mount
from generator.nodes import clients, images, secrets, survey
from generator.stack import NodeStack, claims
from generator.stack.render import node_stacks

DOWN_TIMEOUT = 120  # per node: stop (30 s grace per service) and remove
ENDING = 40  # seconds a stopped or killed container's processes may take to end (30 s grace)
HEALTH_LINES = 3  # of a failing health check's output, shown in errors
SUPERVISOR_LINES = 200  # of a log searched for the supervisor's last line


def client(cluster: Cluster, node: Node, outdir: Path) -> DockerClient:
    """The node's engine over its context; Compose reads contexts.env, which points the stack's
    secrets at the files `up` writes on the node."""
    folder = outdir / node.name
    return clients.client(
        node.docker_context, [folder / "compose.yaml"], [folder / "contexts.env"], cluster.name
    )


class Fleet:
    def __init__(
        self,
        cluster: Cluster,
        outdir: Path,
        report: Report,
        secret_files: dict[str, Path] | None = None,
        source: str = "",
    ) -> None:
        """`cluster` as rendered into `outdir` (with a lock, its image is the locked ID) from
        the config file named `source`."""
        self.cluster, self.source = cluster, source
        self.outdir, self.report = outdir, report
        self.secret_files = secret_files or {}
        self.stacks: dict[str, NodeStack] = {s.node.name: s for s in node_stacks(cluster, source)}
        self.head = cluster.head
        self.wrapper = self.stacks[self.head.name].image
        self.gcs = self.stacks[self.head.name].gcs_address
        self.docker = {n.name: client(cluster, n, outdir) for n in cluster.nodes}

    # Reaching the nodes

    def contexts_answer(self, timeout: float = 30, reached: Iterable[str] = ()) -> None:
        """Every node's engine answers over its context; those `reached` just now are not asked
        again."""

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

        skip = set(reached)
        asked = [n for n in self.cluster.nodes if n.name not in skip]
        parallel("contexts", {n.name: probe(n) for n in asked}, timeout, self.report)

    def images(self, nodes: list[Node] | None = None) -> dict[str, str]:
        """The wrapper image on every node (or those given): node -> what it took."""
        targets = {
            n.name: images.Target(n.name, self.docker[n.name], self.outdir / n.name)
            for n in nodes or self.cluster.nodes
        }
        took = images.distribute(
            list(targets.values()), self.wrapper, self.cluster.image, self.report
        )
        # The metrics services' images, as they are, on each node that runs them.
        wanted: dict[str, list[images.Target]] = {}
        for name, target in targets.items():
            for sidecar in self.stacks[name].sidecars:
                wanted.setdefault(sidecar.image, []).append(target)
        for image, where in wanted.items():
            for node, what in images.spread(where, image, self.report).items():
                if what != "present":
                    self.report(f"image: {image} {what} on {node}")
        return took

    def push_secrets(self, nodes: list[Node] | None = None) -> dict[str, dict[str, float]]:
        """Each node's secret files onto the node, all nodes (or those given) at once; node ->
        secret -> when its contents last changed there (secrets.push). Compose creates no
        container of a service whose secret file is missing, one-off ones (preflight's facts)
        included."""

        def push(node: Node) -> Callable[[], dict[str, float]]:
            used = self.stacks[node.name].used_secrets
            files = {n: p for n, p in self.secret_files.items() if n in used}
            docker, name = self.docker[node.name], self.cluster.name
            return lambda: secrets.push(docker, node.name, name, self.wrapper, files)

        work = {n.name: push(n) for n in nodes or self.cluster.nodes}
        return parallel("secrets", work, 120, self.report)

    def neighbours(self, nodes: list[Node], stopped: bool = False) -> dict[str, list[claims.Claim]]:
        """node -> the other clusters running on it (with `stopped`, stopped ones too), as their
        containers' labels claim; ours from our own config file is not one (claims.foreign)."""
        seen = survey.on_nodes(nodes, stopped)
        return claims.split(seen, self.cluster.name, self.source)[0]

    def image_ids(self, ref: str, nodes: list[Node]) -> dict[str, str | None]:
        """node -> the ID its engine has under `ref`, None where it has none; all at once."""
        work: dict[str, Callable[[], Image]]
        work = {n.name: partial(self.docker[n.name].image.inspect, ref) for n in nodes}
        seen = each(work, 30)
        return {n: None if isinstance(v, BaseException) else v.id for n, v in seen.items()}

    # One-off health runs

    def health(self, node: Node, probe: list[str]) -> Any:
        """A probe (generator/base/probes.py) in a one-off container of the node's first service,
        started as the stack starts it; its JSON output."""
        service = self.stacks[node.name].services[0]
        args = probe[1:]
        try:
            run = self.docker[node.name].compose.run
            out = run(service.name, args, entrypoint=probes.HEALTH, remove=True,
                      dependencies=False, tty=False)  # fmt: skip
        except DockerException as e:
            raise DockerError.wrap(node.name, f"{args[0]} failed", e) from None
        return json.loads(str(out))

    def one_off(self, node: Node, probe: list[str], **options: Any) -> Any:
        """A probe in a one-off container of the wrapper image itself (not of the stack, as
        `health` runs), with python-on-whales's `run` options; its JSON output."""
        try:
            out = self.docker[node.name].run(
                self.wrapper, probe[1:], entrypoint=probes.HEALTH, remove=True, **options
            )
        except DockerException as e:
            raise DockerError.wrap(node.name, f"{probe[1]} failed", e) from None
        return json.loads(str(out))

    def manifest(self, node: Node) -> dict[str, Any]:
        """The model's manifest on a node: every file's size and sha256 (symlinks followed)."""
        mount = model_mount(self.cluster.model.path)
        probe = probes.manifest(self.cluster.model.path)
        return dict(self.one_off(node, probe, volumes=[(mount, mount, "ro")]))

    # The running stack

    def compose_up(self, node: Node, services: list[str]) -> None:
        self.docker[node.name].compose.up(services, detach=True, quiet=True, pull="never")

    def execute(self, node: Node, service: str, args: list[str]) -> str:
        return str(self.docker[node.name].compose.execute(service, args, tty=False))

    def states(self, node: Node) -> dict[str, ContainerState]:
        """service -> its container's state, exited ones included."""
        return {service_of(c): c.state for c in self.containers(node)}

    def containers(self, node: Node) -> list[Container]:
        """The stack's containers on the node, exited ones included."""
        return list(self.docker[node.name].compose.ps(all=True))

    def running(self, node: Node, service: str) -> bool:
        """Its container runs, and so does its command (not waiting out a back-off after it
        exited: the container stays up then, see image/group.py)."""
        found = self.docker[node.name].compose.ps([service], all=True)
        if not found or found[0].state.running is not True:
            return False
        return not probes.exited(self.tail(node, service, SUPERVISOR_LINES))

    def ended(self, node: Node, services: list[str], seconds: float = ENDING) -> None:
        """Back once none of `services` runs on the node (at most `seconds`): a killed container
        ends seconds after its kill event, and Compose starts nothing while it still runs."""

        def running() -> bool:
            return any(s.running for name, s in self.states(node).items() if name in services)

        deadline = time.monotonic() + seconds
        if running():
            self.report(f"start again: {node.name}'s {', '.join(services)} still ending; waiting")
        while running() and time.monotonic() < deadline:
            time.sleep(1)

    def failing_service(self, node: Node) -> tuple[str, str] | None:
        """The node's service that is not running or not healthy, with its last health output."""
        for container in self.docker[node.name].compose.ps(all=True):
            state = container.state
            health = health_of(state)
            if not state.running or health in ("unhealthy", "starting"):
                log = state.health.log if state.health and state.health.log else []
                # Its last lines: what the check said, after whatever the libraries logged.
                said = (log[-1].output or "").strip().splitlines() if log else []
                return service_of(container), "\n".join(said[-HEALTH_LINES:])
        return None

    def tail(self, node: Node, service: str, lines: int) -> str:
        try:
            return str(
                self.docker[node.name].compose.logs([service], tail=str(lines), no_log_prefix=True)
            )
        except DockerException as e:
            return f"(logs unavailable: {reason(e)})"

    def all_logs(self, node: Node, lines: int) -> str:
        """Every service's last `lines` lines, exited containers too, each with its service and
        time."""
        return str(self.docker[node.name].compose.logs(tail=str(lines), timestamps=True))

    @contextlib.contextmanager
    def follow(self, node: Node, service: str) -> Iterator[queue.Queue[str | None]]:
        """The service's log lines as they come, then None when it ends. python-on-whales streams
        a log until the container stops and cannot end it sooner, and a `logs --follow` left
        behind would outlive the command: so this is the one Docker command the tool runs as a
        process of its own (python-on-whales's compose command line), ended on leaving."""
        cmd = [*self.docker[node.name].client_config.docker_compose_cmd, "logs", "--follow"]
        follower = subprocess.Popen(
            [*map(str, cmd), "--no-log-prefix", service],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        assert follower.stdout is not None
        try:
            yield pump(raw.decode(errors="replace").rstrip("\n") for raw in follower.stdout)
        finally:
            follower.terminate()
            follower.wait()

    def remove(self, node: Node, service: str) -> None:
        self.docker[node.name].compose.rm([service], stop=True, volumes=True)

    def down(
        self, nodes: list[Node] | None = None, volumes: bool = True, stop: int | None = None
    ) -> dict[str, str]:
        """Every node (or those given) in parallel; node -> 'removed' or why it is not clean.
        Without `volumes`, the named volumes stay (the head's /tmp: Ray's session logs).
        `stop`: seconds each container has after SIGTERM (default: its stop_grace_period)."""

        def one(node: Node) -> Callable[[], object]:
            return lambda: self.docker[node.name].compose.down(
                remove_orphans=True, volumes=volumes, quiet=True, timeout=stop
            )

        chosen = self.cluster.nodes if nodes is None else nodes
        outcome = each({n.name: one(n) for n in chosen}, DOWN_TIMEOUT)
        return {
            name: f"failed: {reason(found)}" if isinstance(found, BaseException) else "removed"
            for name, found in outcome.items()
        }

    def drop_volumes_since(self, before: dict[str, set[str]]) -> None:
        """The project's volumes made since `before` (by one-off containers: empty), removed."""
        for node, now in survey.volumes(self.cluster).items():
            new: list[Volume | str] = [*sorted(now - before.get(node, now))]
            with contextlib.suppress(DockerException):
                if new:
                    self.docker[node].volume.remove(new)

    # Ray, read from the head's GCS inside its Ray container

    def ray_nodes(self, node: Node | None = None) -> dict[str, float] | None:
        """IP -> GPUs of every node alive in Ray, as the head's GCS tells `node`'s Ray container
        (default: the head's); None when it does not answer."""
        return cast("dict[str, float] | None", self._ray_view(probes.nodes(self.gcs), node))

    def gpu_slots(self) -> dict[str, dict[str, float]] | None:
        """IP -> {"gpus": total, "free": free now} of every node alive in Ray."""
        return cast("dict[str, dict[str, float]] | None", self._ray_view(probes.slots(self.gcs)))

    def _ray_view(self, probe: list[str], node: Node | None = None) -> Any:
        try:
            return json.loads(self.execute(node or self.head, "ray", probe) or "{}")
        except (DockerException, ValueError):
            return None
