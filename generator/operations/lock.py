"""The lock: what a config resolved to when it was locked, so the same config gives the same stack.

`<config stem>.lock.json` beside the config holds the base image's ID (and repo digest when it has
one), the versions inside it, the model's manifest (size and sha256 of every file; the revision of
an HF cache snapshot), the config's hash and the tool's version. With a lock, stacks name the base
image by ID, and any difference from the lock is an error naming it until the lock is updated.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, Field, ValidationError, field_validator
from python_on_whales import Image

from generator import __version__
from generator.base import probes, sidefiles
from generator.base.errors import ConfigError, DriftError
from generator.base.manifest import differences
from generator.config import Cluster, ports, validation
from generator.config.sections import ABS_PATH, IMAGE
from generator.nodes.fleet import Fleet
from generator.stack import slots
from generator.stack.output import write_atomic
from generator.stack.render import wrapper_tag

IMAGE_ID = r"^sha256:[0-9a-f]{64}$"
DIGEST = r"^[^\x00-\x20@]{1,255}@sha256:[0-9a-f]{64}$"  # a repo digest: NAME@sha256:HEX


class LockedImage(BaseModel):
    ref: str = Field(pattern=IMAGE)
    id: str = Field(pattern=IMAGE_ID)
    digests: list[Annotated[str, Field(pattern=DIGEST)]]


class LockedWrapper(BaseModel):
    tag: str = Field(pattern=IMAGE)


class LockedFile(BaseModel):
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class LockedModel(BaseModel):
    path: str = Field(pattern=ABS_PATH)
    revision: str | None = Field(default=None, pattern=r"^[0-9A-Za-z._-]{1,128}$")
    files: dict[str, LockedFile]

    @field_validator("files")
    @classmethod
    def _inside(cls, files: dict[str, LockedFile]) -> dict[str, LockedFile]:
        """Each file a path under the model's folder: relative, no '..', no control character."""
        for name in files:
            parts = name.split("/")
            if (
                not name
                or name.startswith("/")
                or ".." in parts
                or "" in parts
                or any(ord(c) < 0x20 or c == "\x7f" for c in name)
            ):
                raise ValueError(f"{name!r} is not a file under the model's folder")
        return files


class Lock(BaseModel):
    tool: str
    config_hash: str
    image: LockedImage
    wrapper: LockedWrapper
    versions: dict[str, str | None]
    model: LockedModel
    # Picked for a config without vllm.port (slots.py): a slot's API port, never anything else.
    api_port: int | None = Field(
        default=None, strict=True, ge=slots.DEFAULT, le=slots.DEFAULT + ports.SLOTS - 1
    )


def path_for(config: Path) -> Path:
    return sidefiles.Beside(config).lock


def read(config: Path) -> Lock | None:
    """The config's lock; None when it has none."""
    path = path_for(config)
    return read_file(path) if path.exists() or path.is_symlink() else None


def read_file(path: Path) -> Lock:
    try:
        data = json.loads(sidefiles.read(path))
    except RecursionError:
        raise ConfigError(str(path), ["not a readable lock: nested too deep"]) from None
    except (OSError, ValueError) as e:
        raise ConfigError(str(path), [f"not a readable lock: {e}"]) from None
    try:
        return Lock.model_validate(data)
    except ValidationError as e:
        raise ConfigError(str(path), validation.problems(e, Lock, {})) from None


def make(
    cluster: Cluster,
    image_id: str,
    digests: list[str],
    versions: dict[str, str | None],
    model: dict[str, Any],
    config_hash: str | None = None,
    api_port: int | None = None,
) -> Lock:
    # The wrapper is built on each node from the base: its tag follows from the base's ID and the
    # wrapper's files; its image ID differs per node (build time), so the tag is what is pinned.
    wrapper = wrapper_tag(cluster.model_copy(update={"image": image_id}))
    return Lock(
        tool=f"vllm-compose {__version__}",
        config_hash=config_hash or cluster.config_hash(),
        image=LockedImage(ref=cluster.configured_image, id=image_id, digests=sorted(digests)),
        wrapper=LockedWrapper(tag=wrapper),
        versions=versions,
        model=LockedModel.model_validate({"path": cluster.model.path, **model}),
        api_port=api_port,
    )


def write(config: Path, lock: Lock) -> Path:
    """Atomically: a reader never sees half a lock."""
    path = path_for(config)
    write_atomic(path, text(lock))
    return path


def text(lock: Lock) -> str:
    """The lock as its file holds it."""
    return json.dumps(lock.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"


def key(lock: Lock | None) -> str:
    """A short name for the lock (a hash of its text): `unlocked` without one."""
    return hashlib.sha256(text(lock).encode()).hexdigest()[:12] if lock else "unlocked"


def resolve(fleet: Fleet, base: Image, config_hash: str, port_given: bool) -> Lock:
    """What the head resolves the config (of `config_hash`) to now, `fleet` pinned to the `base`
    image its head holds: that image, the versions inside it and the model's manifest (every
    file hashed, on the head); and the API port picked for it when the config names none."""
    head, cluster = fleet.head, fleet.cluster
    fleet.contexts_answer(30)
    fleet.images([head])
    fleet.push_secrets([head])
    fleet.report(f"lock: hashing {cluster.model.path} on {head.name}")
    facts = fleet.health(head, probes.facts("lo", "127.0.0.1", 0))
    manifest = fleet.manifest(head)
    picked = None if port_given else cluster.vllm.port
    digests = list(base.repo_digests)
    return make(cluster, base.id, digests, facts["versions"], manifest, config_hash, picked)


def pinned(cluster: Cluster, lock: Lock) -> Cluster:
    """The cluster with its base image named by the locked ID (and at the API port picked for
    it, when the config names none)."""
    pinned = cluster.pinned_to(lock.image.id)
    if lock.api_port is None or slots.given(cluster):
        return pinned
    return slots.at(pinned, lock.api_port)


def config_drift(cluster: Cluster, lock: Lock) -> list[str]:
    if lock.config_hash != cluster.config_hash():
        return ["the config changed since it was locked (its hash differs)"]
    return []


def image_drift(lock: Lock, held: dict[str, str | None]) -> list[str]:
    """held: node -> the ID its engine has under the image's ref (None: not there)."""
    want = lock.image.id
    return [
        f"{node} holds {lock.image.ref} as {got[:19]}, the lock says {want[:19]}"
        for node, got in held.items()
        if got is not None and got != want
    ]


def refuse_image_drift(fleet: Fleet, lock: Lock, lock_file: Path) -> None:
    """A node whose engine holds another image under the locked ref has drifted."""
    drift = image_drift(lock, fleet.image_ids(lock.image.ref, fleet.cluster.nodes))
    if drift:
        raise DriftError(drift, lock_file)


def model_drift(lock: Lock, node: str, files: dict[str, int] | None) -> list[str]:
    """Against a node's file list and sizes (a full sha256 check is sync-model's)."""
    path = lock.model.path
    if files is None:
        return [f"{node}: {path} is missing"]
    found = differences({n: f.size for n, f in lock.model.files.items()}, files)
    labelled = found.labelled("missing", "not in the lock", "size")
    return [f"{node}: {path}: {label}: {', '.join(names[:3])}" for label, names in labelled]
