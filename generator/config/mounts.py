"""What a container mounts of its node to read the model, and the folders of a node no mount may
cover: the root, system folders, the tool's own state (every cluster's secrets) and Docker's
data."""

from __future__ import annotations

import posixpath
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from generator.config import Cluster

SYSTEM_TOP = {"/bin", "/boot", "/etc", "/home", "/lib", "/lib64", "/opt", "/root", "/sbin", "/srv",
              "/tmp", "/usr", "/var"}  # fmt: skip
SYSTEM_TREES = {"/dev", "/proc", "/run", "/sys", "/etc", "/boot"}
# Folders of the nodes a model mount may never cover: every cluster's secrets, Docker's data.
STATE_TREES = ("/var/lib/vllm-compose", "/var/lib/docker")


def model_mount(path: str) -> str:
    """What a container mounts to read the model, normalised (`//etc`, `a/../b`): the model
    folder, or for a Hugging Face cache snapshot (.../models--ORG--NAME/snapshots/REV) its
    repository folder, where the snapshot's links point; nothing above it."""
    folder = posixpath.normpath("/" + path.lstrip("/"))
    parent = posixpath.dirname(folder)
    repo = posixpath.dirname(parent)
    if posixpath.basename(parent) == "snapshots" and posixpath.basename(repo).startswith(
        "models--"
    ):
        return repo
    return folder


def model_problems(c: Cluster) -> list[str]:
    mount = model_mount(c.model.path)
    top = "/" + mount.split("/")[1] if mount != "/" else "/"
    state = any(mount == t or mount.startswith(t + "/") for t in STATE_TREES)
    if mount == "/" or (mount == top and top in SYSTEM_TOP) or top in SYSTEM_TREES or state:
        return [f"model.path: {c.model.path} is a system folder, not a model; give its own folder"]
    return []
