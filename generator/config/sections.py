"""The sections of the cluster config: a node, the model, vLLM, Ray, the group, secrets and the
upgrade's canary."""

from __future__ import annotations

import re
from ipaddress import IPv4Address
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

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
# Routed by its hex at the door (spaces, '#' are fine); not a flag on vLLM's command line.
SERVED_NAME = r"^[^\x00-\x1f\x7f-][^\x00-\x1f\x7f]*$"

Port = Annotated[int, Field(ge=1, le=65535)]


def seconds(default: int, low: int, high: int, description: str) -> Any:
    """A field of whole seconds, from `low` to `high`."""
    return Field(default=default, ge=low, le=high, description=description)


def image(default: str, description: str) -> Any:
    """A field naming an image, with its default."""
    return Field(default=default, pattern=IMAGE, description=description)


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
    port: Port = Field(
        default=8000,
        description="Port of the OpenAI-compatible API on the head; its last two digits (the "
        "cluster's slot) set every other port's default. Unset: where the cluster runs, else the "
        "first of 8000, 8001, ... whose slot is free on all its nodes (a lock records it).",
    )
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
    served_model_name: Annotated[str, TEXT] | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        pattern=SERVED_NAME,
        description="Model name clients send in requests (default: the model path).",
    )
    safetensors_load_strategy: Literal["lazy", "eager"] | None = Field(
        default=None, description="vLLM's safetensors loading (default: the profile's, if any)."
    )
    master_port: Port | None = Field(
        default=None,
        description="Rendezvous port of rank 0 for the native backend (default: 29501 minus "
        "the cluster's slot, the last two digits of `vllm.port`).",
    )
    startup_timeout: int = seconds(
        1800,
        10,
        86400,
        "Seconds the model may take to load before the serve service counts as failed.",
    )
    args: list[Annotated[str, Field(max_length=4096), TEXT]] = Field(
        default_factory=list,
        max_length=256,
        description="Further `vllm serve` arguments, passed verbatim and in order.",
    )


class Ray(Strict):
    port: Port | None = Field(
        default=None,
        description="Port of the Ray head's GCS (default: 6379 plus the cluster's slot, the last "
        "two digits of `vllm.port`; Ray's other ports follow the slot too).",
    )
    object_store_memory: int | None = Field(
        default=None,
        ge=78643200,
        le=1 << 44,
        description="Bytes for Ray's object store, 75 MiB to 16 TiB (default: profile's).",
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
        "absolute (default: CONFIG-STEM.state/api-key, generated with mode 0600 when missing).",
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
        "config or absolute (backend ray; default: CONFIG-STEM.state/ray-token, generated with "
        "mode 0600 when missing).",
    )


class Group(Strict):
    port: Port | None = Field(
        default=None,
        description="Port on each node's private IP where its containers tell the group which "
        "start they are in (a node that restarted makes every node start again with it; "
        "default: 29510 plus the cluster's slot, the last two digits of `vllm.port`).",
    )
    grace: int = seconds(
        10, 2, 600, "Seconds a node may not answer before the others leave the group to re-form."
    )
    hang_after: int = seconds(
        60,
        0,
        3600,
        "Seconds the head's serve may leave its own one-token completion unanswered, "
        "while vLLM counts no token, before the group re-forms (a hung rank; armed by the first "
        "answer after each start; 0: never).",
    )


class Canary(Strict):
    prompt: Annotated[str, TEXT] | None = Field(
        default=None,
        max_length=4096,
        description="A golden prompt `upgrade` sends (temperature 0) after the new group's first "
        "completion; the upgrade rolls back unless the answer matches `expect`.",
    )
    expect: str | None = Field(
        default=None,
        max_length=1024,
        description="Regular expression the golden prompt's answer must contain a match of.",
    )
    max_tokens: int = Field(default=16, ge=1, le=4096, description="Tokens the answer may have.")

    @field_validator("expect")
    @classmethod
    def _expect_compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as e:
                raise ValueError(f"not a regular expression: {e}") from None
        return value

    @model_validator(mode="after")
    def _both_or_neither(self) -> Canary:
        if (self.prompt is None) != (self.expect is None):
            raise ValueError("set both prompt and expect, or neither")
        return self
