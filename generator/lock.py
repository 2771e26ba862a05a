"""The lock: what a config resolved to when it was locked, so the same config gives the same stack.

`<config stem>.lock.json` beside the config holds the base image's ID (and repo digest when it has
one), the versions inside it, the model's manifest (size and sha256 of every file; the revision of
an HF cache snapshot), the config's hash and the tool's version. With a lock, stacks name the base
image by ID, and any difference from the lock is an error naming it until the lock is updated.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from generator import __version__
from generator.config import Cluster
from generator.errors import VllmComposeError
from generator.render import wrapper_tag

Lock = dict[str, Any]


def path_for(config: Path) -> Path:
    return config.with_name(f"{config.stem}.lock.json")


def read(config: Path) -> Lock | None:
    path = path_for(config)
    if not path.exists():
        return None
    try:
        return dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError) as e:
        raise VllmComposeError(f"{path}: unreadable lock: {e}", "delete it and lock again") from e


def make(
    cluster: Cluster, image_id: str, digests: list[str], versions: dict[str, Any], model: Lock
) -> Lock:
    # The wrapper is built on each node from the base: its tag follows from the base's ID and the
    # wrapper's files; its image ID differs per node (build time), so the tag is what is pinned.
    wrapper = wrapper_tag(cluster.model_copy(update={"image": image_id}))
    return {
        "tool": f"vllm-compose {__version__}",
        "config_hash": cluster.config_hash(),
        "image": {"ref": cluster.image, "id": image_id, "digests": sorted(digests)},
        "wrapper": {"tag": wrapper},
        "versions": versions,
        "model": {"path": cluster.model.path, **model},
    }


def write(config: Path, lock: Lock) -> Path:
    """Atomically: a reader never sees half a lock."""
    path = path_for(config)
    text = json.dumps(lock, indent=2, sort_keys=True) + "\n"
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    Path(tmp).replace(path)
    return path


def pinned(cluster: Cluster, lock: Lock) -> Cluster:
    """The cluster with its base image named by the locked ID."""
    return cluster.model_copy(update={"image": lock["image"]["id"]})


def config_drift(cluster: Cluster, lock: Lock) -> list[str]:
    if lock["config_hash"] != cluster.config_hash():
        return ["the config changed since it was locked (its hash differs)"]
    return []


def image_drift(lock: Lock, held: dict[str, str | None]) -> list[str]:
    """held: node -> the ID its engine has under the image's ref (None: not there)."""
    want = lock["image"]["id"]
    return [
        f"{node} holds {lock['image']['ref']} as {got[:19]}, the lock says {want[:19]}"
        for node, got in held.items()
        if got is not None and got != want
    ]


def model_drift(lock: Lock, node: str, files: dict[str, int] | None) -> list[str]:
    """Against a node's file list and sizes (a full sha256 check is sync-model's)."""
    path, wanted = lock["model"]["path"], lock["model"]["files"]
    if files is None:
        return [f"{node}: {path} is missing"]
    problems = []
    missing = sorted(set(wanted) - set(files))
    extra = sorted(set(files) - set(wanted))
    differ = sorted(n for n in set(wanted) & set(files) if files[n] != wanted[n]["size"])
    for label, names in (("missing", missing), ("not in the lock", extra), ("size", differ)):
        if names:
            problems.append(f"{node}: {path}: {label}: {', '.join(names[:3])}")
    return problems
