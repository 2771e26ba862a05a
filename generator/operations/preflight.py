"""Preflight: every misconfiguration that can be checked, named in seconds, before anything starts.

Per node and all at once, over the node's context: one short-lived container of the stack's own
first service (`compose run --rm --no-deps`: the stack's image, network, IPC, mounts, limits and
environment) reports its `Facts`; generator/operations/checks.py compares them across nodes.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from generator.base import probes
from generator.base.errors import DockerError, DriftError, PreflightError, reason
from generator.base.fanout import each
from generator.base.verdict import Check, failed, passed
from generator.config import Node, ports
from generator.nodes import door, survey
from generator.nodes.fleet import Fleet
from generator.operations import checks, lock
from generator.operations.checks import Facts
from generator.operations.stamps import Stamps
from generator.stack import claims
from generator.stack.claims import Claim

REACH_SECONDS = 6  # how long each node keeps trying to reach its peers
RUN_TIMEOUT = 60  # a facts container that has not answered by then is a failure
# Below Linux's ephemeral ports (32768+), above Ray's worker ports (10002-19999): a fresh port
# per run, so no stale listener can answer and no outgoing connection holds it.
REACH_PORTS = (20000, 29000)
PORT_TRIES = 3


def run(
    fleet: Fleet, stamped: Stamps | None = None, drop_caches: bool = False
) -> tuple[list[Check], float]:
    """Every check, on every node whose context answers; and how long they took. Writes the
    secret files onto the nodes first: Compose creates no container whose secret is missing.
    `stamped`: the model files as verify last found them (stamps.py). `drop_caches`:
    each node's page cache dropped first (asked for only: it slows every read after it)."""
    start = time.monotonic()
    # One look at every node's running clusters: the neighbours, and whether its engine answers.
    seen, unanswered = survey.look(fleet.cluster.nodes, report=fleet.report)
    found = contexts(fleet, unanswered)
    live = [n for n in fleet.cluster.nodes if n.name in seen]
    if live:
        fleet.images(live)
        fleet.push_secrets(live)
    if drop_caches and live:
        found += dropped(fleet, live)
    more, facts = gather(fleet, live)
    bases = fleet.image_ids(fleet.cluster.image, live)
    others = claims.split(seen, fleet.cluster.name, fleet.source)[0]
    found += more + checks.evaluate(fleet.cluster, facts, bases, ours(fleet), stamped, others)
    return found, time.monotonic() - start


def must_pass(
    fleet: Fleet,
    others: dict[str, list[Claim]],
    locked: lock.Lock | None,
    lock_file: Path,
    stamped: Stamps | None = None,
) -> None:
    """Within up: the contexts answered and the image is everywhere; the rest must pass, and
    with a lock every node's model must match it. `others`: the other clusters on the nodes
    (fleet.neighbours), as up looked before it wrote anything."""
    start = time.monotonic()
    nodes = fleet.cluster.nodes
    found, facts = gather(fleet, nodes)
    bases = fleet.image_ids(fleet.cluster.image, nodes)
    found += checks.evaluate(fleet.cluster, facts, bases, ours(fleet), stamped, others)
    failures = [c.line() for c in found if c.status == "fail"]
    if failures:
        raise PreflightError(failures, time.monotonic() - start)
    for node, notes in claims.apart(fleet.cluster, others).items():  # passed, but worth saying
        for note in notes:
            fleet.report(f"front door: {node}: {note}")
    if locked:
        drift = [
            line
            for node, seen in facts.items()
            for line in lock.model_drift(locked, node, seen.model)
        ]
        if drift:
            raise DriftError(drift, lock_file)


def dropped(fleet: Fleet, live: list[Node]) -> list[Check]:
    """A check per node: its page cache dropped, and how much memory that freed."""
    # Writing /proc/sys/vm/drop_caches takes SYS_ADMIN and a /proc/sys that Docker leaves
    # writable (systempaths=unconfined); nothing more, so not --privileged. No network.
    options = {
        "cap_add": ["SYS_ADMIN"],
        "security_options": ["systempaths=unconfined"],
        "networks": ["none"],
    }
    work: dict[str, Callable[[], Any]]
    work = {n.name: partial(fleet.one_off, n, probes.drop_caches(), **options) for n in live}
    found = []
    for node, outcome in each(work, RUN_TIMEOUT, fleet.report, "drop-caches").items():
        if isinstance(outcome, BaseException):
            cause = f"the page cache was not dropped: {reason(outcome)}"
            hint = "sync; echo 3 > /proc/sys/vm/drop_caches as root on the node"
            found.append(failed("drop-caches", node, cause, hint))
            continue
        before, after = outcome.get("before") or {}, outcome.get("after") or {}
        freed = (after.get("MemFree", 0) - before.get("MemFree", 0)) / 2**30
        what = f"page cache dropped: {freed:.1f} GiB freed, {after.get('MemFree', 0) / 2**30:.1f}"
        found.append(passed("drop-caches", node, f"{what} GiB free"))
    return found


def contexts(fleet: Fleet, unanswered: dict[str, str]) -> list[Check]:
    """A check per node: its context answers, or why not (`unanswered`: survey.look's)."""
    found = []
    for node in fleet.cluster.nodes:
        if node.name in unanswered:
            cause = f"context '{node.docker_context}' does not answer: {unanswered[node.name]}"
            hint = f"docker --context {node.docker_context} info"
            found.append(failed("context", node.name, cause, hint))
        else:
            found.append(passed("context", node.name, f"'{node.docker_context}' answers"))
    return found


def gather(fleet: Fleet, live: list[Node]) -> tuple[list[Check], dict[str, Facts]]:
    """The facts of every live node, from a container started as its stack starts it; a node
    whose container fails gets a failed check instead. A reach port that something else holds
    on a node (a serving group, an outgoing connection) is tried again on another port."""
    taken = set(ports.opened(fleet.cluster).values())
    for attempt in range(PORT_TRIES):
        port = random.choice([p for p in range(*REACH_PORTS) if p not in taken])
        failures, gathered = _gather(fleet, live, port)
        busy = [n for n, f in gathered.items() if f.reach.busy]
        if not busy or attempt == PORT_TRIES - 1:
            break
        fleet.report(f"preflight: port {port} is in use on {', '.join(busy)}; trying another")
        taken.add(port)
    return failures, gathered


def _gather(fleet: Fleet, live: list[Node], port: int) -> tuple[list[Check], dict[str, Facts]]:
    c = fleet.cluster

    def facts(node: Node) -> Callable[[], Facts]:
        peers = [str(n.ip) for n in live if n != node]
        api = c.vllm.port if node == c.head else None
        probe = probes.facts(
            c.interface_of(node), str(node.ip), port, peers, REACH_SECONDS, c.model.path, api
        )
        return lambda: Facts.model_validate(fleet.health(node, probe))

    found = each({n.name: facts(n) for n in live}, RUN_TIMEOUT, fleet.report, "preflight")
    failures: list[Check] = []
    gathered: dict[str, Facts] = {}
    for node in live:
        outcome = found[node.name]
        if isinstance(outcome, Facts):
            gathered[node.name] = outcome
            continue
        why = outcome.what if isinstance(outcome, DockerError) else reason(outcome)
        if "bind source path does not exist" in f"{why}\n{getattr(outcome, 'detail', '')}":
            # The stack mounts the model without creating it: its container cannot start here.
            cause = f"{c.model.path} is missing (the node's other checks need it to run)"
            failures.append(failed("model", node.name, cause, "copy the model to every node"))
        else:
            cause = f"the preflight container failed: {why}"
            failures.append(failed("container", node.name, cause, "vllm-compose logs CONFIG"))
    return failures, gathered


def ours(fleet: Fleet) -> checks.Running:
    """What of this stack already runs on the head: serve, and the front door (either holds the
    API port)."""
    head = fleet.head
    found = each({name: partial(fleet.running, head, name) for name in ("serve", door.NAME)}, 30)
    return checks.Running(serve=found["serve"] is True, door=found[door.NAME] is True)
