"""Change a serving group with a way back: `upgrade` stages the changed config while the old
group serves (re-lock on the head, the image on every node, secrets, preflight), then switches
(old group down, new group up behind its gate and the config's golden prompt). If the new group
fails, the stack that served before (history.py) is started again and the lock put back.
`rollback` goes back to the stack before the one that serves now."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, NoReturn

from python_on_whales import DockerException

from generator import config
from generator.base import probes
from generator.base.errors import PhaseError, RolledBack, VllmComposeError, reason
from generator.config import ports
from generator.nodes import door, doorreplicas, survey
from generator.operations import gate, history, lock
from generator.operations.deploy import Result
from generator.operations.workflow import Opened

# Opens the config (or a history entry's) for a command that starts things: workflow.opened
# with the command's output folder, progress and timeouts already applied.
Open = Callable[..., AbstractContextManager[Opened]]
# Seconds the old group's containers have to stop in a switch before they are killed: by then it
# is being replaced, and every second it takes is downtime.
SWITCH_STOP = 2
DRAIN = 600  # seconds a replica's requests under way have to end before it goes down anyway
BACK = 120  # seconds for a replica back in service to pass the door's checks


@dataclass
class Switched:
    result: Result
    downtime: float  # seconds from the old group's stop to the new group's first answer
    entry: history.Entry  # what serves now


def upgrade(path: Path, open_: Open, accept_changed_answers: bool = False) -> Switched:
    """Stage, switch, check; on a failed switch or check, the previous stack again. With
    `accept_changed_answers`, answers that differ from those `check` recorded are recorded anew
    instead of failing the canary."""
    previous = history.latest(path)
    if previous is None:
        raise VllmComposeError(
            f"{path}: no stack has served from this config yet, so there is nothing to upgrade "
            "from or roll back to",
            hint=f"start it with: vllm-compose up {path}",
        )
    config.load(path)  # an invalid config is refused here: nothing rendered, generated or asked
    before = gate.recorded(path)  # so are golden answers that cannot be read
    result = Result()
    with contextlib.ExitStack() as stack:
        try:  # re-lock and render (opening), then stage: the old group serves on meanwhile
            staged = stack.enter_context(open_(path, update_lock=True, with_secrets=True))
            made = survey.volumes(staged.cluster)
            _same_replicas(staged, previous)
            for group in staged.groups:
                group.stage(result)
        except (VllmComposeError, DockerException):
            _restore_files(path, previous, open_)
            raise
        canary = Canary(before, accept_changed_answers)
        switch = _rolling if staged.cluster.replicas > 1 else _switch
        try:
            return switch(path, staged, result, previous, open_, canary)
        except RolledBack:
            staged.fleet.drop_volumes_since(made)  # the failed stack's (its compile cache)
            raise


def rollback(path: Path, open_: Open) -> Switched:
    """The stack before the one that serves now, started in its place (replica by replica, each
    drained first, with replicas)."""
    entry = history.before_latest(path)
    result = Result()
    with open_(path, with_secrets=True, entry=entry) as back:
        start = time.monotonic()
        if back.cluster.replicas > 1:
            for index in range(back.cluster.replicas):
                _replica_back(back, index, result)
            _put_lock_back(path, entry)
            now = history.record(path, entry.config_text, entry.locked)
            return Switched(result, time.monotonic() - start, now)
        back.fleet.report("rollback: taking the group that serves now down")
        door.group_down(back.fleet, stop=SWITCH_STOP)
        back.deployment.start(result)
        _put_lock_back(path, entry)
        now = history.record(path, entry.config_text, entry.locked)
        return Switched(result, time.monotonic() - start, now)


def _switch(
    path: Path,
    staged: Opened,
    result: Result,
    previous: history.Entry,
    open_: Open,
    canary: Canary,
) -> Switched:
    fleet = staged.fleet
    start = time.monotonic()
    try:
        fleet.report("switch: taking the old group down (volumes kept: its compile caches)")
        door.group_down(fleet, stop=SWITCH_STOP)
        staged.deployment.start(result)
        golden(staged)
        answers(path, staged, canary)
    except (VllmComposeError, DockerException) as e:
        if isinstance(e, PhaseError) and e.phase == "canary":
            staged.deployment.take_down("canary failed", "taken down")
        _rolled_back(e, previous, partial(_restart, path, previous, open_))
    entry = history.record(path, staged.config_text, lock.read(path))
    return Switched(result, time.monotonic() - start, entry)


def _same_replicas(staged: Opened, previous: history.Entry) -> None:
    """A change of `replicas` moves nodes between groups: not an upgrade's to roll."""
    was = config.parse(previous.config_text).replicas
    if staged.cluster.replicas != was:
        raise VllmComposeError(
            f"replicas: {was} serve now and the config asks for {staged.cluster.replicas}; an"
            " upgrade rolls replicas as they are",
            hint="change replicas with: vllm-compose down CONFIG, then vllm-compose up CONFIG",
        )


def _rolling(
    path: Path,
    staged: Opened,
    result: Result,
    previous: history.Entry,
    open_: Open,
    canary: Canary,
) -> Switched:
    """Replica by replica, the others serving meanwhile: drained at the door (no new request;
    those under way end), its group down, the new one up behind its gate, its golden prompt and
    `check`'s answers asked, then back in the door's rotation. A replica that fails is started
    again as it served, the replicas before it too, one by one; the upgrade stops there."""
    start = time.monotonic()
    for index, group in enumerate(staged.groups):
        one = dataclasses.replace(staged, deployment=group, cluster=group.fleet.cluster)
        try:
            _drained(staged, index)
            group.fleet.report("switch: taking the old replica down (volumes kept)")
            door.group_down(group.fleet, stop=SWITCH_STOP)
            group.start(result)
            golden(one)
            answers(path, one, canary)
            _back_in(staged, index)
        except (VllmComposeError, DockerException) as e:
            if isinstance(e, PhaseError) and e.phase == "canary":
                group.take_down("canary failed", "taken down")
            _rolled_back(e, previous, partial(_replicas_back, path, previous, open_, index))
    entry = history.record(path, staged.config_text, lock.read(path))
    return Switched(result, time.monotonic() - start, entry)


def _rolled_back(failed: Exception, previous: history.Entry, back: Callable[[], None]) -> NoReturn:
    """After a failed switch: the stack that served before started again by `back`, and
    RolledBack raised; when that fails too, an error naming both causes."""
    try:
        back()
    except (VllmComposeError, DockerException) as again:
        said = f"upgrade failed: {reason(failed)}; the rollback to {previous.when} failed too"
        raise VllmComposeError(f"{said}: {reason(again)}") from again
    hint = failed.hint if isinstance(failed, VllmComposeError) else None
    raise RolledBack(reason(failed), previous.when, hint) from failed


def _replicas_back(path: Path, previous: history.Entry, open_: Open, failed: int) -> None:
    """Replica `failed` and those before it, last first, started again as they served (the
    others drained first); the lock put back."""
    with open_(path, with_secrets=True, entry=previous) as back:
        for index in range(failed, -1, -1):
            _replica_back(back, index, Result(), drain=index != failed)
    _put_lock_back(path, previous)


def _drained(opened: Opened, index: int) -> None:
    fleet = opened.fleet
    fleet.report(f"drain: replica {index + 1}: no new requests; those under way end first")
    left = doorreplicas.drained(fleet, index, DRAIN)
    if left:
        fleet.report(f"drain: replica {index + 1}: {left} request(s) still under way after"
                     f" {DRAIN} s; they end with it")  # fmt: skip


def _back_in(opened: Opened, index: int) -> None:
    if not doorreplicas.ready(opened.fleet, index, BACK):
        raise PhaseError(opened.fleet.head.name, "front door", f"replica {index + 1} serves but"
                         f" did not pass the door's checks within {BACK} s")  # fmt: skip
    opened.fleet.report(f"front door: replica {index + 1} is back in its rotation")


def _replica_back(back: Opened, index: int, result: Result, drain: bool = True) -> None:
    """Replica `index` of the stack `back` opens started in place of the one that serves."""
    group = back.groups[index]
    if drain:
        _drained(back, index)
    group.fleet.report(f"rollback: replica {index + 1}: starting the stack that served before")
    door.group_down(group.fleet, stop=SWITCH_STOP)
    group.start(result)
    _back_in(back, index)


def golden(opened: Opened) -> None:
    """The config's golden prompt, asked of the new group: its answer must match."""
    c, fleet = opened.cluster, opened.fleet
    if c.canary.prompt is None or c.canary.expect is None:
        return
    fleet.report("canary: asking the golden prompt")
    probe = probes.golden(
        ports.vllm(c), c.served_model_name, c.canary.prompt, c.canary.expect, c.canary.max_tokens
    )
    try:
        fleet.execute(fleet.head, "serve", probe)
    except DockerException as e:
        said = reason(e).removeprefix(f"{probes.HEALTH}: ")
        raise PhaseError(fleet.head.name, "canary", said) from None


@dataclass(frozen=True)
class Canary:
    before: dict[str, Any] | None  # the answers `check` recorded, read before anything changed
    accept: bool  # answers that changed are recorded anew, not a failed canary


def answers(path: Path, opened: Opened, canary: Canary) -> None:
    """The answers `check` recorded, asked of the new group: a change fails the canary, unless
    accepted (then the new answers are recorded)."""
    before = canary.before
    if before is None:
        return
    fleet = opened.fleet
    fleet.report("canary: asking the prompts `check` recorded answers to")
    found = gate.ask(fleet)
    verdict = gate.golden(found, before)
    if verdict.ok is not False:
        return
    if not canary.accept:
        said = f"the answers changed: {verdict.said}"
        hint = "keep the new answers with: upgrade --accept-changed-answers"
        raise PhaseError(fleet.head.name, "canary", said, hint=hint)
    fleet.report(f"canary: the answers changed ({verdict.said}); accepted and recorded")
    gate.record(path, found, opened.locked)


def _restart(path: Path, previous: history.Entry, open_: Open) -> None:
    """The stack that served before, started again (its caches are still there); the lock and
    the compose folders put back to it."""
    with open_(path, with_secrets=True, entry=previous) as back:
        back.fleet.report(f"rollback: starting the stack of {previous.when} again")
        back.deployment.start(Result())
    _put_lock_back(path, previous)


def _restore_files(path: Path, previous: history.Entry, open_: Open) -> None:
    """After a failed staging: the lock and the compose folders as the serving stack has them."""
    with open_(path, with_secrets=True, entry=previous):
        pass  # opening renders the entry's folders
    _put_lock_back(path, previous)


def _put_lock_back(path: Path, entry: history.Entry) -> None:
    locked = entry.locked
    if locked:
        lock.write(path, locked)
    else:
        lock.path_for(path).unlink(missing_ok=True)
