"""The cluster config: pydantic models, cross-field rules, and `load(path)`.

Every key a user writes has a description; the README's config reference and `vllm-compose schema`
are generated from them.
"""

from __future__ import annotations

import hashlib
import json
from ipaddress import IPv4Address
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from generator.errors import ConfigError
from generator.profiles import PROFILES, Profile, ProfileName

NAME = r"^[a-z0-9][a-z0-9_-]{0,62}$"
IFNAME = r"^[A-Za-z0-9_.:-]{1,15}$"
ENV_KEY = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
# A Docker image reference: [registry[:port]/]path[:tag][@digest], no spaces or control characters.
IMAGE = r"^[a-z0-9][a-z0-9._/:-]{0,254}(@sha256:[0-9a-f]{64})?$"
ABS_PATH = r"^/[^\x00-\x1f:]*$"

# Values vllm-compose derives per node; setting them by hand would make nodes disagree.
PER_NODE_ENV = ("VLLM_HOST_IP", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
# NCCL settings a node's own hardware decides (its RDMA devices): never copied from the head.
PER_NODE_HARDWARE_ENV = ("NCCL_IB_HCA",)
SECRET_ENV = {
    "VLLM_API_KEY": "api_key_file",
    "RAY_AUTH_TOKEN": "ray_token_file",
    "HF_TOKEN": "hf_token_file",
    "HUGGING_FACE_HUB_TOKEN": "hf_token_file",
}
MEMORY_MONITOR = "RAY_memory_monitor_refresh_ms"
RAY_AUTH_ENV = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH")
# `vllm serve` flags that have a named field: a second copy in `args` would silently win or lose.
NAMED_FLAGS = {
    "--tensor-parallel-size": "tensor_parallel_size",
    "-tp": "tensor_parallel_size",
    "--pipeline-parallel-size": "pipeline_parallel_size",
    "-pp": "pipeline_parallel_size",
    "--gpu-memory-utilization": "gpu_memory_utilization",
    "--max-model-len": "max_model_len",
    "--port": "port",
    "--served-model-name": "served_model_name",
    "--distributed-executor-backend": "backend (top level)",
    "--safetensors-load-strategy": "safetensors_load_strategy",
    "--nnodes": "backend: native (derived from nodes)",
    "--node-rank": "backend: native (derived from nodes)",
    "--master-addr": "backend: native (derived from the head node)",
    "--master-port": "master_port",
    "--headless": "backend: native (derived from nodes)",
}

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
    args: list[Annotated[str, Field(max_length=4096)]] = Field(
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


SECRET_FILE = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$"


class Secrets(Strict):
    api_key_file: str | None = Field(
        default=None,
        pattern=SECRET_FILE,
        description="File beside the config holding the API key clients must send (default: "
        "CONFIG-STEM.api-key, generated with mode 0600 when missing).",
    )
    hf_token_file: str | None = Field(
        default=None,
        pattern=SECRET_FILE,
        description="File beside the config holding a Hugging Face token (default: none).",
    )
    ray_token_file: str | None = Field(
        default=None,
        pattern=SECRET_FILE,
        description="File beside the config holding the token Ray's nodes authenticate with "
        "(backend ray; default: CONFIG-STEM.ray-token, generated with mode 0600 when missing).",
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
    env: dict[Annotated[str, Field(pattern=ENV_KEY)], Annotated[str, Field(max_length=8192)]] = (
        Field(default_factory=dict, max_length=256, description="Environment added on every node.")
    )
    secrets: Secrets = Field(
        default_factory=Secrets,
        description="Secret files; their contents never enter a rendered file, a container's "
        "configured environment, a command line or a log.",
    )

    @model_validator(mode="after")
    def _check(self) -> Cluster:
        problems = [*_node_problems(self), *_parallel_problems(self), *_override_problems(self)]
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


def _duplicates(values: list[str]) -> dict[int, int]:
    """Index of each repeated value -> index of its first occurrence."""
    first: dict[str, int] = {}
    repeats = {}
    for i, value in enumerate(values):
        j = first.setdefault(value, i)
        if j != i:
            repeats[i] = j
    return repeats


def _node_problems(c: Cluster) -> list[str]:
    problems = []
    for field, values in (
        ("name", [n.name for n in c.nodes]),
        ("ip", [str(n.ip) for n in c.nodes]),
        ("context", [n.docker_context for n in c.nodes]),
    ):
        for i, j in _duplicates(values).items():
            problems.append(
                f"nodes.{i}.{field}: {values[i]} is already used by node '{c.nodes[j].name}'"
            )
    heads = [i for i, n in enumerate(c.nodes) if n.role == "head"]
    problems += [
        f"nodes.{i}.role: a second head; only one node may say 'role: head'" for i in heads[1:]
    ]
    problems += [
        f"nodes.{i}.interface: no interface for node '{n.name}'; set `interface` at the top level"
        " or on the node"
        for i, n in enumerate(c.nodes)
        if not c.interface_of(n)
    ]
    return problems


def _parallel_problems(c: Cluster) -> list[str]:
    tp, pp = c.tensor_parallel_size, c.vllm.pipeline_parallel_size
    if tp * pp > c.gpu_total:
        return [
            f"vllm.tensor_parallel_size: TP {tp} x PP {pp} = {tp * pp} GPUs asked for,"
            f" the nodes have {c.gpu_total}"
        ]
    return []


def _override_problems(c: Cluster) -> list[str]:
    problems = [
        f"env.{key}: set per node by vllm-compose from nodes[].ip / interface; remove it here"
        for key in PER_NODE_ENV
        if key in c.env
    ]
    problems += [
        f"env.{key}: a secret in env shows in `docker inspect`; put it in the file "
        f"secrets.{field} names"
        for key, field in SECRET_ENV.items()
        if key in c.env
    ]
    problems += [
        f"env.{key}: set by vllm-compose from ray.token_auth; set that instead"
        for key in RAY_AUTH_ENV
        if key in c.env
    ]
    if c.backend == "ray" and "VLLM_CONFIG_ROOT" in c.env:
        problems.append(
            "env.VLLM_CONFIG_ROOT: set by vllm-compose (backend ray): it holds the list that keeps"
            " per-node variables on their node; remove it here"
        )
    for i, arg in enumerate(c.vllm.args):
        if arg.split("=", 1)[0] in ("--api-key", "--hf-token"):
            problems.append(
                f"vllm.args.{i}: a secret on the command line shows in `ps` and `docker inspect`;"
                " use secrets.api_key_file / secrets.hf_token_file"
            )
        flag = arg.split("=", 1)[0]
        if flag in NAMED_FLAGS:
            problems.append(
                f"vllm.args.{i}: {flag} has a named field ({NAMED_FLAGS[flag]}); set it there"
            )
    return problems


def warnings(c: Cluster) -> list[str]:
    """Allowed but risky settings, shown by validate and render."""
    found = []
    if c.backend == "ray" and c.env.get(MEMORY_MONITOR, "0") != "0":
        found.append(
            f"env.{MEMORY_MONITOR}: overriding the default 0 re-enables Ray's memory monitor,"
            " which kills workers during weight loading on unified-memory GPUs"
        )
    if c.backend == "ray" and not c.ray.token_auth:
        found.append(
            "ray.token_auth: off; Ray's GCS and node ports listen on every address of every node"
            " and run whatever anyone who reaches them sends"
        )
    if "--trust-remote-code" in c.vllm.args:
        found.append("vllm.args: --trust-remote-code runs code from the model repository")
    return found


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML keeps the last of two equal keys; a config with one is almost always a mistake."""


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            mark = key_node.start_mark
            raise yaml.MarkedYAMLError(problem=f"duplicate key '{key}'", problem_mark=mark)
        seen.add(key)
    return loader.construct_mapping(node)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def parse(text: str, source: str = "config") -> Cluster:
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise ConfigError(source, [f"{where}{e.problem}"]) from None
    except yaml.YAMLError as e:
        raise ConfigError(source, [f"not valid YAML: {e}"]) from None
    if not isinstance(data, dict):
        raise ConfigError(source, ["the file must hold a mapping (name: ..., nodes: ...)"])
    try:
        return Cluster.model_validate(data)
    except ValidationError as e:
        raise ConfigError(source, _problems(e)) from None


def load(path: Path) -> Cluster:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(str(path), [f"cannot read it: {e}"]) from None
    return parse(text, str(path))


def _problems(error: ValidationError) -> list[str]:
    lines = []
    for err in error.errors(include_url=False):
        where = ".".join(str(part) for part in err["loc"])
        if err["type"] == "value_error" and not where:
            lines += str(err["ctx"]["error"]).splitlines()
        elif err["type"] == "extra_forbidden":
            lines.append(f"{where}: unknown key{_known_keys(err['loc'])}")
        else:
            lines.append(f"{where}: {_message(err)}")
    return lines


_PATTERN_HINTS = {
    NAME: "use 1-63 lowercase letters, digits, '-' or '_', starting with a letter or digit",
    IFNAME: "an interface name has 1-15 letters, digits, '_', '.', ':' or '-'",
    ENV_KEY: "a variable name has letters, digits and '_', not starting with a digit",
    IMAGE: "expected an image reference like registry/name:tag or name@sha256:<digest>",
    ABS_PATH: "expected an absolute path without ':' or control characters",
    SECRET_FILE: "a file name beside the config: letters, digits, '_', '.', '-', no '/'",
}


def _message(err: Any) -> str:
    shown = repr(err["input"])[:80]
    if err["type"] == "value_error":
        return str(err["ctx"]["error"])
    if err["type"] == "string_pattern_mismatch":
        pattern = err["ctx"]["pattern"]
        return f"{shown} is not allowed: {_PATTERN_HINTS.get(pattern, 'must match ' + pattern)}"
    if err["type"] == "string_type" and isinstance(err["input"], int | float | bool):
        return f"expected a string, got {shown}; quote it in the YAML"
    return str(err["msg"])


def _known_keys(loc: tuple[int | str, ...]) -> str:
    model: type[BaseModel] = Cluster
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        annotation = model.model_fields[str(part)].annotation
        inner = getattr(annotation, "__args__", (annotation,))[0]
        if not (isinstance(inner, type) and issubclass(inner, BaseModel)):
            return ""
        model = inner
    return f" (known: {', '.join(model.model_fields)})"
