"""The cluster config: pydantic models, cross-field rules, and `load(path)`.

Every key a user writes has a description; the config reference in docs/reference.md and
`vllm-compose schema` are generated from them.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, PrivateAttr, ValidationError, model_validator

from generator.base import sidefiles
from generator.base.errors import ConfigError
from generator.config import rules, validation
from generator.config.door import FrontDoor
from generator.config.metrics import Metrics
from generator.config.profiles import PROFILES, Profile, ProfileName
from generator.config.sections import (
    ABS_PATH,
    ENV_KEY,
    IFNAME,
    IMAGE,
    NAME,
    SECRET_FILE,
    SERVED_NAME,
    TEXT,
    Canary,
    Group,
    Model,
    Node,
    Ray,
    Secrets,
    Strict,
    Vllm,
)

__all__ = [
    "Canary",
    "Cluster",
    "FrontDoor",
    "Group",
    "Metrics",
    "Model",
    "Node",
    "Ray",
    "Secrets",
    "Vllm",
    "load",
    "parse",
    "warnings",
]

# The names the rules use, importable from here as before.
PER_NODE_ENV = rules.PER_NODE_ENV
PER_NODE_HARDWARE_ENV = rules.PER_NODE_HARDWARE_ENV
MEMORY_MONITOR = rules.MEMORY_MONITOR
warnings = rules.warnings


class Cluster(Strict):
    name: str = Field(pattern=NAME, description="Cluster name; the Compose project name.")
    image: str = Field(
        pattern=IMAGE, description="vLLM image every node runs (the wrapper image's base)."
    )
    backend: Literal["ray", "native"] = Field(
        default="ray",
        description="`ray`: vLLM over a Ray cluster; `native`: vLLM's own multi-node mode, no Ray.",
    )
    profile: ProfileName = Field(
        default="generic", description="Hardware defaults: `generic` or `dgx-spark`."
    )
    accelerator: Literal["nvidia", "none"] = Field(
        default="nvidia",
        description="`nvidia` hands each node's GPUs to its containers; `none` for CPU builds.",
    )
    interface: str | None = Field(
        default=None, pattern=IFNAME, description="Default network interface of the private link."
    )
    nodes: list[Node] = Field(min_length=1, max_length=64, description="The nodes, head first.")
    replicas: int = Field(
        default=1,
        ge=1,
        le=16,
        description="Groups serving the model, each over an equal share of `nodes` in order (a "
        "share's first node is its head), all under one model name behind the front door on the "
        "first node, which balances them (`front_door.balance`).",
    )
    model: Model = Field(description="The model to serve.")
    vllm: Vllm = Field(default_factory=Vllm, description="`vllm serve` settings.")
    ray: Ray = Field(default_factory=Ray, description="Ray settings (backend: ray).")
    group: Group = Field(
        default_factory=Group, description="How the nodes restart together (after a reboot too)."
    )
    canary: Canary = Field(
        default_factory=Canary, description="What `upgrade` asks of the new group before it stays."
    )
    gpu_temperature_limit: int = Field(
        default=90,
        ge=40,
        le=110,
        description="°C. Preflight fails a GPU at or over it (or throttled for heat); `watch` "
        "holds a restart while a node's GPU is over it.",
    )
    env: dict[
        Annotated[str, Field(pattern=ENV_KEY)], Annotated[str, Field(max_length=8192), TEXT]
    ] = Field(default_factory=dict, max_length=256, description="Environment added on every node.")
    front_door: FrontDoor = Field(
        default_factory=FrontDoor,
        description="HAProxy in front of vLLM on the head: keys, limits, requests held through "
        "recoveries.",
    )
    metrics: Metrics | None = Field(
        default=None,
        description="Prometheus on the head and exporters on every node (`metrics: {}` for the "
        "defaults; off when absent).",
    )
    secrets: Secrets = Field(
        default_factory=Secrets,
        description="Secret files; their contents never enter a rendered file, a container's "
        "configured environment, a command line or a log.",
    )

    _configured_image: str | None = PrivateAttr(default=None)  # see configured_image
    _replica: int | None = PrivateAttr(default=None)  # a replica's index (see groups)
    _shares: tuple[tuple[Node, ...], ...] = PrivateAttr(default=())  # every replica's nodes
    _whole_hash: str | None = PrivateAttr(default=None)  # a replica's: the whole config's hash

    @model_validator(mode="after")
    def _check(self) -> Cluster:
        problems = rules.problems(self)
        if problems:
            raise ValueError("\n".join(problems))
        return self

    # Derived values, read by the renderer and the deployer.

    @property
    def head(self) -> Node:
        return next((n for n in self.nodes if n.role == "head"), self.nodes[0])

    @property
    def workers(self) -> list[Node]:
        return [n for n in self.members if n is not self.head]

    @property
    def members(self) -> list[Node]:
        """The nodes of one group: every node, or with replicas the first share."""
        if self._replica is not None or self.replicas == 1:
            return self.nodes
        return self.nodes[: max(1, len(self.nodes) // self.replicas)]

    @property
    def groups(self) -> list[Cluster]:
        """The replicas, each this cluster over its share of the nodes; the first keeps the
        front door, which balances them all, the others answer on `vllm.port` with the API key
        (the door's to send). The cluster itself when it is one group."""
        if self._replica is not None or self.replicas == 1:
            return [self]
        size = len(self.members)
        shares = tuple(tuple(self.nodes[i * size : (i + 1) * size]) for i in range(self.replicas))
        return [self._view(i, shares) for i in range(self.replicas)]

    def _view(self, index: int, shares: tuple[tuple[Node, ...], ...]) -> Cluster:
        door = self.front_door if index == 0 else self.front_door.model_copy(
            update={"enabled": False})  # fmt: skip
        view = self.model_copy(update={"nodes": list(shares[index]), "front_door": door})
        view._replica, view._shares, view._whole_hash = index, shares, self.config_hash()
        return view

    @property
    def replica(self) -> int:
        """This group's index among the replicas (0: the first, with the front door)."""
        return self._replica or 0

    @property
    def replica_heads(self) -> tuple[Node, ...]:
        """Every replica's head, in order (a view's; one group's own head otherwise)."""
        return tuple(share[0] for share in self._shares) or (self.head,)

    @property
    def replica_nodes(self) -> tuple[tuple[Node, ...], ...]:
        """Every replica's nodes, in order (a view's; one group's own otherwise)."""
        return self._shares or (tuple(self.nodes),)

    @property
    def runs_prometheus(self) -> bool:
        """Whether this group's head runs Prometheus (`metrics`): with replicas, the first's
        alone, which scrapes them all."""
        return self.metrics is not None and self.replica == 0

    @property
    def gpu_total(self) -> int:
        return sum(n.gpus for n in self.members)

    @property
    def tensor_parallel_size(self) -> int:
        pp = self.vllm.pipeline_parallel_size
        return self.vllm.tensor_parallel_size or max(1, self.gpu_total // pp)

    @property
    def settings(self) -> Profile:
        return PROFILES[self.profile]

    @property
    def served_model_name(self) -> str:
        return self.vllm.served_model_name or self.model.path

    @property
    def configured_image(self) -> str:
        """The image as the config names it, also once a lock pinned `image` to its ID."""
        return self._configured_image or self.image

    def pinned_to(self, image_id: str) -> Cluster:
        """This cluster with its image named by `image_id`."""
        pinned = self.model_copy(update={"image": image_id})
        pinned._configured_image = self.configured_image
        return pinned

    def interface_of(self, node: Node) -> str:
        return node.interface or self.interface or ""

    def config_hash(self) -> str:
        """The config's, for its lock (a replica's: the whole config's). Keys added since locks
        were made count only when set away from their defaults, so a lock made before them still
        matches."""
        if self._whole_hash:
            return self._whole_hash
        data = self.model_dump(mode="json")
        for section, key, default in _LATER_KEYS:
            where = data.get(section, {}) if section else data
            if where.get(key) == default:
                del where[key]
        canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


# (section or "", key, default): keys added after locks were first written (config_hash).
_LATER_KEYS = [("", "replicas", 1), ("front_door", "balance", "leastconn")]


# How a pattern mismatch is explained, per pattern.
_PATTERN_HINTS = {
    NAME: "use 1-63 lowercase letters, digits, '-' or '_', starting with a letter or digit",
    IFNAME: "an interface name has 1-15 letters, digits, '_', '.', ':' or '-'",
    ENV_KEY: "a variable name has letters, digits and '_', not starting with a digit",
    IMAGE: "expected an image reference like registry/name:tag or name@sha256:<digest>",
    ABS_PATH: "expected an absolute path without ':' or control characters",
    SECRET_FILE: "a file's path, relative to the config or absolute, without control characters",
    SERVED_NAME: "a name without control characters (a line break, a tab, NUL), not starting"
    " with '-'",
}


def parse(text: str, source: str = "config") -> Cluster:
    data = validation.read_yaml(text, source)
    try:
        return Cluster.model_validate(data)
    except ValidationError as e:
        raise ConfigError(source, validation.problems(e, Cluster, _PATTERN_HINTS)) from None


def read(path: Path) -> str:
    """The config's text: a regular file (a link is followed: the config is the user's to
    place), UTF-8, not over validation's limit; never opened when it is not."""
    try:
        why = sidefiles.problem(path, validation.MAX_BYTES, follow=True)
        if why:
            raise ConfigError(str(path), [f"the file {why}"])
        return path.read_bytes().decode("utf-8")
    except OSError as e:
        raise ConfigError(str(path), [f"cannot read it: {e}"]) from None
    except UnicodeDecodeError:
        raise ConfigError(str(path), ["the file is not UTF-8 text"]) from None


def load(path: Path) -> Cluster:
    return parse(read(path), str(path))
