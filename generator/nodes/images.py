"""The wrapper image on every node: built there from the node's base image (pulled when missing
and pullable), else streamed from a node that has it, to every such node at once, and checked by
ID after loading. A node that has the image moves nothing."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import IO

from python_on_whales import DockerClient, DockerException, Image
from python_on_whales.exceptions import NoSuchImage
from python_on_whales.utils import run

from generator.base.errors import DockerError
from generator.base.fanout import Report, each
from generator.nodes import clients

CHUNK = 1 << 20
# On the wrapper: the ID of the base it was built from. Layers alone miss a base rebuilt with only
# another ENV, LABEL or CMD (no new layer), and its wrapper would keep the old base's settings.
BASE_LABEL = "io.vllm-compose.base-id"


@dataclass(frozen=True)
class Target:
    name: str
    docker: DockerClient
    folder: Path  # the node's rendered folder: the wrapper's build context


def held(node: str, context: str, ref: str) -> Image:
    """The base image `ref` as the engine behind `context` holds it (pulled when missing and
    pullable): its ID and repository digests, which a lock pins before anything is rendered."""
    docker = clients.client(context, [], [], "")
    try:
        with contextlib.suppress(NoSuchImage):
            return docker.image.inspect(ref)
    except DockerException as e:
        raise DockerError.wrap(node, f"looking for the base image {ref}", e) from None
    try:
        docker.image.pull(ref, quiet=True)
        return docker.image.inspect(ref)
    except DockerException:
        hint = f"docker save {ref} | docker --context {context} load"
        missing = f"base image {ref} is not there and cannot be pulled"
        raise DockerError(node, missing, hint=hint) from None


def ensure(target: Target, tag: str, base: str) -> str:
    """'present', 'built', 'rebuilt' (the node's base changed under the same name since the
    wrapper was built: a re-pulled or rebuilt `:latest`), or 'no-base' (the node cannot get the
    base: it needs a transfer). One look at each image when both are there."""
    docker = target.docker
    wrapper, origin = _found(docker, tag), _found(docker, base)
    if wrapper is not None:
        if origin is None or wrapper[1] == origin[0]:
            return "present"
        _build(target, tag, base, origin[0])
        return "rebuilt"
    if origin is None:
        try:
            docker.image.pull(base, quiet=True)
        except DockerException:
            return "no-base"
        origin = _found(docker, base) or ("", "")
    _build(target, tag, base, origin[0])
    return "built"


def _found(docker: DockerClient, ref: str) -> tuple[str, str] | None:
    """The image's ID and the base ID it is labelled with ("" when none); None when the node
    has no such image. One call: python-on-whales's Image looks again when read later."""
    form = "{{.Id}} {{json .Config.Labels}}"
    try:
        said = run([*docker.client_config.docker_cmd, "image", "inspect", "--format", form, ref])
    except NoSuchImage:
        return None
    found, _, labels = str(said).strip().partition(" ")
    return found, (json.loads(labels) or {}).get(BASE_LABEL, "")


def _build(target: Target, tag: str, base: str, base_id: str) -> None:
    """The wrapper built on the node from `base`, labelled with the ID it was built on."""
    try:
        target.docker.legacy_build(
            target.folder, build_args={"BASE_IMAGE": base}, labels={BASE_LABEL: base_id}, tags=[tag]
        )
    except DockerException as e:
        raise DockerError(target.name, f"building {tag} from {base} failed", e.stderr or "") from e


def stream(tag: str, source: Target, dests: list[Target], report: Report) -> int:
    """One `docker save` on the source, every byte of it written to a `docker load` on each
    destination at once (the source reads the image once, however many nodes lack it), with
    progress; each destination checked by ID. Returns the bytes moved to each. Processes of its
    own (python-on-whales's command lines): python-on-whales's save and load streams split the
    tar at newline bytes, leave their pipes open, and give `docker save` 0.1 s to exit
    (tests/test_layout.py names this exception)."""
    size = source.docker.image.inspect(tag).size
    save = subprocess.Popen(
        [*map(str, source.docker.client_config.docker_cmd), "save", tag], stdout=subprocess.PIPE
    )
    loads = {
        d.name: subprocess.Popen(
            [*map(str, d.docker.client_config.docker_cmd), "load", "-q"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for d in dests
    }
    route = f"{source.name} -> {', '.join(loads)}"
    start = time.monotonic()
    moved = _pump(
        save, loads, lambda n: report(f"image: {tag} {route}: {n >> 20} / ~{size >> 20} MiB")
    )
    save.wait()
    _loaded(loads, lambda name, how: report(f"image: {tag} {how} on {name} ({_since(start)})"))
    want = source.docker.image.inspect(tag).id
    for dest in dests:
        load = loads[dest.name]
        assert load.stderr
        with load.stderr:
            err = load.stderr.read().decode(errors="replace")
        if save.returncode or load.returncode:
            raise DockerError(dest.name, f"loading {tag} from node '{source.name}' failed", err)
        got = dest.docker.image.inspect(tag).id
        if want != got:
            raise DockerError(dest.name, f"{tag} arrived as {got[:19]}, expected {want[:19]}")
    return moved


def _pump(
    save: subprocess.Popen[bytes],
    loads: dict[str, subprocess.Popen[bytes]],
    tick: Callable[[int], None],
) -> int:
    """The save's bytes into every load that still takes them (one that broke is named after)."""
    assert save.stdout
    moved, last, taking = 0, time.monotonic(), dict(loads)
    for pipe in [save.stdout, *(load.stdin for load in loads.values())]:
        _widen(pipe)
    with save.stdout:
        while taking and (chunk := save.stdout.read(CHUNK)):
            for name, load in list(taking.items()):
                assert load.stdin
                try:
                    load.stdin.write(chunk)
                except BrokenPipeError:
                    del taking[name]
            moved += len(chunk)
            if time.monotonic() - last > 2:
                tick(moved)
                last = time.monotonic()
    for load in loads.values():
        with contextlib.suppress(BrokenPipeError):
            assert load.stdin
            load.stdin.close()
    return moved


def _widen(pipe: IO[bytes] | None) -> None:
    """A pipe that holds a whole chunk (64 KiB by default): one load that pauses for a moment
    no longer stalls the writes to all the others (a fan-out to 7 nodes took 13 s, not 16)."""
    with contextlib.suppress(ImportError, AttributeError, OSError):  # Linux only; else as it is
        import fcntl

        assert pipe
        fcntl.fcntl(pipe.fileno(), fcntl.F_SETPIPE_SZ, CHUNK)


def _loaded(loads: dict[str, subprocess.Popen[bytes]], said: Callable[[str, str], None]) -> None:
    """Each load waited for, said as it ends: the engines go on writing after the last byte."""
    pending = dict(loads)
    while pending:
        for name, load in list(pending.items()):
            if load.poll() is not None:
                said(name, "loaded" if load.returncode == 0 else "not loaded")
                del pending[name]
        time.sleep(0.1)


def _since(start: float) -> str:
    return f"{time.monotonic() - start:.0f} s"


def distribute(targets: list[Target], tag: str, base: str, report: Report) -> dict[str, str]:
    """Every node ends with `tag`; returns node -> 'present', 'built' or 'streamed'."""
    outcome = _all_at_once({t.name: partial(ensure, t, tag, base) for t in targets})
    hint = f"docker save {base} | docker --context <node> load"
    missing = f"base image {base} is not there and cannot be pulled; no node has {tag}"
    return _stream_lacking(targets, tag, outcome, report, missing, hint)


def spread(targets: list[Target], image: str, report: Report) -> dict[str, str]:
    """An image used as it is (the metrics services') on every node: 'present', 'pulled', or
    'streamed' from a node that has it."""

    def get(target: Target) -> str:
        if target.docker.image.exists(image):
            return "present"
        try:
            target.docker.image.pull(image, quiet=True)
        except DockerException:
            return "no-base"
        return "pulled"

    outcome = _all_at_once({t.name: partial(get, t) for t in targets})
    hint = f"docker save {image} | docker --context <node> load"
    missing = f"image {image} is not there and cannot be pulled; no node has it"
    return _stream_lacking(targets, image, outcome, report, missing, hint)


def _stream_lacking(
    targets: list[Target],
    tag: str,
    outcome: dict[str, str],
    report: Report,
    missing: str,
    hint: str,
) -> dict[str, str]:
    """`tag` streamed to every node whose outcome is 'no-base', from one that has it."""
    have = [t for t in targets if outcome[t.name] != "no-base"]
    lacking = [t for t in targets if outcome[t.name] == "no-base"]
    if lacking and not have:
        raise DockerError(lacking[0].name, missing, hint=hint)

    if not lacking:
        return outcome
    moved = stream(tag, have[0], lacking, report)
    names = ", ".join(t.name for t in lacking)
    report(f"image: {tag} streamed {have[0].name} -> {names} ({moved >> 20} MiB each)")
    return outcome | {t.name: "streamed" for t in lacking}


def _all_at_once(work: dict[str, Callable[[], str]]) -> dict[str, str]:
    """Every node's outcome; the first node's error is raised."""
    found = each(work, float("inf"))
    for outcome in found.values():
        if isinstance(outcome, BaseException):
            raise outcome
    return {name: str(outcome) for name, outcome in found.items()}
