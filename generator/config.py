"""The cluster config: pydantic models, cross-field rules, and `load(path)`.

Every key a user writes has a description; the README's config reference and `vllm-compose schema`
are generated from them.
"""

from __future__ import annotations

import hashlib
import json
from ipaddress import IPv4Address
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from generator import rules, validation
from generator.errors import ConfigError
from generator.profiles import PROFILES, Profile, ProfileName

NAME = r"^[a-z0-9][a-z0-9_-]{0,62}$"
IFNAME = r"^[A-Za-z0-9_.:-]{1,15}$"
ENV_KEY = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
# A Docker image reference: [registry[:port]/]path[:tag][@digest]. Path components are lower case;
# a registry host and a tag may hold upper case (nvcr.io/nvidia/vllm:25.09-PY3).
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE = (
    r"^(?:(?:[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+|localhost)(?::[0-9]+)?/|[A-Za-z0-9-]+:[0-9]+/)?"
    rf"{_COMPONENT}(?:/{_COMPONENT})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?$"
)


def _text(value: str) -> str:
    """What argv, the environment and a UTF-8 file can carry: anything but NUL and lone
    surrogates (a YAML "\\ud800" escape makes one)."""
    if "\x00" in value or any(0xD800 <= ord(c) <= 0xDFFF for c in value):
        raise ValueError(
            "NUL and lone surrogates cannot be in a command line, the environment or a file"
        )
    return value


TEXT = AfterValidator(_text)
ABS_PATH = r"^/[^\x00-\x1f:]*$"

# The names the rules use, importable from here as before.
PER_NODE_ENV = rules.PER_NODE_ENV
PER_NODE_HARDWARE_ENV = rules.PER_NODE_HARDWARE_ENV
MEMORY_MONITOR = rules.MEMORY_MONITOR
warnings = rules.warnings

Port = Annotated[int, Field(ge=1, le=65535)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class Node(Strict):
    name: str = Field(
        pattern=NAME,
        description="Node name: lowercase letters, digits, '-' and '_'. Names its compose folder.",
    )
    ip: Annotated[IPv4Address, Field(strict=False)] = Field(
        description="The node's address on the private (RoCE) subnet; Ray, NCCL and vLLM use it."
    )
    context: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,99}$",
        description="Docker context that reaches this node's engine (default: the node's name).",
    )
    interface: str | None = Field(
        default=None,
        pattern=IFNAME,
        description="Network interface carrying `ip` on this node (default: the top-level one).",
    )
    gpus: int = Field(default=1, ge=1, le=64, description="GPUs this node contributes.")
    role: Literal["head", "worker"] | None = Field(
        default=None,
        description="`head` marks the head node; by default the first node is the head.",
    )

    @field_validator("ip", mode="before")
    @classmethod
    def _ip_is_written_as_an_address(cls, value: object) -> object:
        # YAML reads 167772162 as an int, which IPv4Address would take: say what was meant.
        if not isinstance(value, str):
            raise ValueError(f"expected an address like 192.168.200.12, got {value!r}")
        return value

    @property
    def docker_context(self) -> str:
        return self.context or self.name


class Model(Strict):
    path: str = Field(
        pattern=ABS_PATH,
        max_length=4096,
        description="Absolute path of the model folder, the same on every node; mounted read-only.",
    )

    @field_validator("path")
    @classmethod
    def _path_is_plain(cls, value: str) -> str:
        if any(part in (".", "..") for part in value.split("/")):
            raise ValueError(f"{value!r} has '.' or '..' in it; write the plain absolute path")
        return value


class Vllm(Strict):
    port: Port = Field(default=8000, description="Port of the OpenAI-compatible API on the head.")
    tensor_parallel_size: int | None = Field(
        default=None, ge=1, le=512, description="Tensor-parallel size (default: all GPUs / PP)."
    )
    pipeline_parallel_size: int = Field(default=1, ge=1, le=64, description="Pipeline stages.")
    gpu_memory_utilization: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="Fraction of GPU memory vLLM may use (default: the profile's).",
    )
    max_model_len: int | None = Field(
        default=None, ge=1, le=10_000_000, description="Maximum context length (default: model's)."
    )
    served_model_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="Model name clients send in requests (default: the model path).",
    )
    safetensors_load_strategy: Literal["lazy", "eager"] | None = Field(
        default=None, description="vLLM's safetensors loading (default: the profile's, if any)."
    )
    master_port: Port = Field(
        default=29501, description="Rendezvous port of rank 0 for the native backend."
    )
    startup_timeout: int = Field(
        default=1800,
        ge=10,
        le=86400,
        description="Seconds the model may take to load before the serve service counts as failed.",
    )
    args: list[Annotated[str, Field(max_length=4096), TEXT]] = Field(
        default_factory=list,
        max_length=256,
        description="Further `vllm serve` arguments, passed verbatim and in order.",
    )


class Ray(Strict):
    port: Port = Field(default=6379, description="Port of the Ray head's GCS.")
    object_store_memory: int | None = Field(
        default=None, ge=78643200, description="Bytes for Ray's object store (default: profile's)."
    )
    dashboard: bool = Field(default=False, description="Run Ray's dashboard (off: no open port).")
    token_auth: bool = Field(
        default=True,
        description="Ray's token authentication (Ray 2.52+): its ports listen on every address "
        "and accept only the cluster's token. Off only for older Ray, on a closed network.",
    )


SECRET_FILE = r"^[^\x00-\x1f]{1,4096}$"


class Secrets(Strict):
    api_key_file: str | None = Field(
        default=None,
        pattern=SECRET_FILE,
        description="File holding the API key clients must send, relative to the config or "
        "absolute (default: CONFIG-STEM.api-key, generated with mode 0600 when missing).",
    )
    hf_token_file: str | None = Field(
        default=None,
        pattern=SECRET_FILE,
        description="File holding a Hugging Face token, relative to the config or absolute "
        "(default: none).",
    )
    ray_token_file: str | None = Field(
        default=None,
        pattern=SECRET_FILE,
        description="File holding the token Ray's nodes authenticate with, relative to the "
        "config or absolute (backend ray; default: CONFIG-STEM.ray-token, generated with mode "
        "0600 when missing).",
    )


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
    model: Model = Field(description="The model to serve.")
    vllm: Vllm = Field(default_factory=Vllm, description="`vllm serve` settings.")
    ray: Ray = Field(default_factory=Ray, description="Ray settings (backend: ray).")
    env: dict[
        Annotated[str, Field(pattern=ENV_KEY)], Annotated[str, Field(max_length=8192), TEXT]
    ] = Field(default_factory=dict, max_length=256, description="Environment added on every node.")
    secrets: Secrets = Field(
        default_factory=Secrets,
        description="Secret files; their contents never enter a rendered file, a container's "
        "configured environment, a command line or a log.",
    )

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
        return [n for n in self.nodes if n is not self.head]

    @property
    def gpu_total(self) -> int:
        return sum(n.gpus for n in self.nodes)

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

    def interface_of(self, node: Node) -> str:
        return node.interface or self.interface or ""

    def config_hash(self) -> str:
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


# How a pattern mismatch is explained, per pattern.
_PATTERN_HINTS = {
    NAME: "use 1-63 lowercase letters, digits, '-' or '_', starting with a letter or digit",
    IFNAME: "an interface name has 1-15 letters, digits, '_', '.', ':' or '-'",
    ENV_KEY: "a variable name has letters, digits and '_', not starting with a digit",
    IMAGE: "expected an image reference like registry/name:tag or name@sha256:<digest>",
    ABS_PATH: "expected an absolute path without ':' or control characters",
    SECRET_FILE: "a file's path, relative to the config or absolute, without control characters",
}


def parse(text: str, source: str = "config") -> Cluster:
    data = validation.read_yaml(text, source)
    try:
        return Cluster.model_validate(data)
    except ValidationError as e:
        raise ConfigError(source, validation.problems(e, Cluster, _PATTERN_HINTS)) from None


def load(path: Path) -> Cluster:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(str(path), [f"cannot read it: {e}"]) from None
    return parse(text, str(path))
