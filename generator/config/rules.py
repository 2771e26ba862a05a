"""The config's cross-field rules, each naming the culprit by its dotted path, and the settings
that are allowed but risky (warnings). Pure functions of a `Cluster`."""

from __future__ import annotations

import re
from ipaddress import IPv4Address
from typing import TYPE_CHECKING

from generator.config import groups, mounts, ports

if TYPE_CHECKING:
    from generator.config import Cluster

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
# Names that hold a secret, whatever their prefix: OPENAI_API_KEY, HF_API_TOKEN,
# AWS_SECRET_ACCESS_KEY, DB_PASSWORD.
SECRET_NAME = re.compile(r"(^|_)(TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|ACCESS_KEY)$|(^|_)SECRET_")
# Linux refuses to start a process whose environment and arguments pass 2 MiB (and any one string
# 128 KiB); the stacks add their own on top of these.
ENV_BYTES = 256 << 10
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
    "--model": "model.path",
    "--host": "front_door.enabled (behind the front door vLLM listens on loopback)",
}
SECRET_FLAGS = ("--api-key", "--hf-token")
RAY_METRICS = "RAY_enable_metrics_collection"  # off unless metrics.ray_port (ports.py)


def problems(c: Cluster) -> list[str]:
    return [
        *_node_problems(c),
        *groups.problems(c),
        *_port_problems(c),
        *mounts.model_problems(c),
        *_metrics_problems(c),
        *_door_problems(c),
        *_env_problems(c),
        *_arg_problems(c),
    ]


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
    if len(c.nodes) > 1 and all(n.role == "worker" for n in c.nodes):
        problems.append(
            "nodes.0.role: every node says 'role: worker'; say 'role: head' on the head"
            " (or drop the roles: the first node is the head)"
        )
    problems += [
        f"nodes.{i}.interface: '{c.interface_of(n)}' is not an interface name"
        for i, n in enumerate(c.nodes)
        if c.interface_of(n) in (".", "..")
    ]
    problems += [
        f"nodes.{i}.interface: no interface for node '{n.name}'; set `interface` at the top level"
        " or on the node"
        for i, n in enumerate(c.nodes)
        if not c.interface_of(n)
    ]
    return problems + [
        f"nodes.{i}.ip: {n.ip} is {kind}; use the node's address on the private link"
        for i, n in enumerate(c.nodes)
        if (kind := _not_a_node_address(n.ip, alone=len(c.nodes) == 1))
    ]


def _not_a_node_address(ip: IPv4Address, alone: bool) -> str | None:
    """What kind of address other nodes cannot reach a node at, or None for an ordinary one
    (loopback serves a node that is the whole cluster)."""
    kinds = [
        (ip.is_unspecified, "the unspecified address"),
        (ip.is_loopback and not alone, "a loopback address"),
        (ip.is_link_local, "a link-local (169.254.x) address"),
        (ip.is_multicast, "a multicast address"),
        (ip == IPv4Address("255.255.255.255"), "the broadcast address"),
        (ip.is_reserved, "a reserved address"),
    ]
    return next((kind for found, kind in kinds if found), None)


def _metrics_problems(c: Cluster) -> list[str]:
    if c.metrics is None:
        return []
    listen, found = c.metrics.listen, []
    other = next((n for n in c.workers if n.ip == listen), None)
    if other:
        found.append(
            f"metrics.listen: {listen} is node '{other.name}''s address; Prometheus runs on the"
            f" head ({c.head.ip})"
        )
    if listen and (listen.is_multicast or listen.is_reserved or listen.is_link_local
                   or listen == IPv4Address("255.255.255.255")):  # fmt: skip
        found.append(f"metrics.listen: {listen} is no address to listen on; the head's private IP"
                     " (the default) or 0.0.0.0")  # fmt: skip
    if c.metrics.ray_port and c.backend != "ray":
        found.append("metrics.ray_port: backend native runs no Ray, so nothing would export there;"
                     " leave it out")  # fmt: skip
    return found


def _port_problems(c: Cluster) -> list[str]:
    """The ports the stacks open, against each other (Ray's worker range as a whole)."""
    spans = ports.ranges(c)
    names = list(spans)
    return [
        f"{name}: {spans[name].start} is taken by {other}; choose another"
        for i, name in enumerate(names)
        for other in names[i + 1 :]
        if ports.overlap(spans[name], spans[other])
    ]


def _door_problems(c: Cluster) -> list[str]:
    """The front door reads a request's model with HAProxy's JSON reader, which drops a \\u
    escape of a character past ASCII (json_query, 2.6 and 3.0), as most clients send one: such a
    name would get 404 at the door. Any other name is routed (the routes' map holds its hex)."""
    name = c.served_model_name
    if c.front_door.enabled and not name.isascii():
        return [
            f"vllm.served_model_name: {name!r} is not ASCII; the front door cannot read it from a"
            " request whose client escapes it (most do): set an ASCII name"
        ]
    return []


def _env_problems(c: Cluster) -> list[str]:
    return [*_env_secrets(c), *_env_owned(c)]


def _env_secrets(c: Cluster) -> list[str]:
    """Secrets, whatever the case of their names: env shows in `docker inspect`."""
    problems = [
        f"env.{key}: a secret in env shows in `docker inspect`; put it in the file "
        f"secrets.{field} names"
        for key in c.env
        if (field := SECRET_ENV.get(key.upper()))
    ]
    return problems + [
        f"env.{key}: a secret in env shows in `docker inspect`; keep it in a file on the nodes"
        " (secrets.hf_token_file for Hugging Face), not in the config"
        for key in c.env
        if key.upper() not in SECRET_ENV and SECRET_NAME.search(key.upper())
    ]


def _env_owned(c: Cluster) -> list[str]:
    """Variables vllm-compose sets itself, and the size of them all."""
    owned = {key: "set per node by vllm-compose from nodes[].ip / interface; remove it here"
             for key in PER_NODE_ENV}  # fmt: skip
    owned |= {key: "set by vllm-compose for the cluster's slot (its Ray metrics port); remove it"
              for key in ports.ray_metrics(c)}  # fmt: skip
    owned |= {key: "set by vllm-compose from ray.token_auth; set that instead"
              for key in RAY_AUTH_ENV}  # fmt: skip
    if c.backend == "ray":
        owned["VLLM_CONFIG_ROOT"] = (
            "set by vllm-compose (backend ray): it holds the list that keeps per-node variables"
            " on their node; remove it here"
        )
    problems = [f"env.{key}: {why}" for key, why in owned.items() if key in c.env]
    problems += [
        f"env.{key}: the wrapper's entrypoint uses VLLM_COMPOSE_* itself; choose another name"
        for key in c.env
        if key.startswith("VLLM_COMPOSE_")
    ]
    size = sum(len(k) + len(v) + 2 for k, v in c.env.items())
    if size > ENV_BYTES:
        problems.append(
            f"env: {size >> 10} KiB of variables; a process cannot start with more than"
            f" {ENV_BYTES >> 10} KiB of them here"
        )
    return problems


def _flag(arg: str) -> str:
    """The long flag vLLM reads `arg` as, before abbreviation: --a_b as --a-b, --f=v as --f."""
    written = arg.split("=", 1)[0]
    return "--" + written[2:].replace("_", "-") if written.startswith("--") else written


def _meant(flag: str, full: str) -> bool:
    """vLLM's parser takes an unambiguous prefix of a long flag for the flag (--tensor-parallel
    for --tensor-parallel-size), so a prefix of three letters or more counts as it."""
    if flag == full:
        return True
    return flag.startswith("--") and len(flag) >= 5 and full.startswith(flag)


def _arg_problems(c: Cluster) -> list[str]:
    problems = []
    for i, arg in enumerate(c.vllm.args):
        flag, written = _flag(arg), arg.split("=", 1)[0]
        if any(_meant(flag, secret) for secret in SECRET_FLAGS):
            problems.append(
                f"vllm.args.{i}: a secret on the command line shows in `ps` and `docker inspect`;"
                " use secrets.api_key_file / secrets.hf_token_file"
            )
            continue
        named = next((f for f in NAMED_FLAGS if _meant(flag, f)), None)
        if named:
            problems.append(
                f"vllm.args.{i}: {written} has a named field ({NAMED_FLAGS[named]}); set it there"
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
    listen = c.metrics.listen if c.metrics else None
    if listen and (listen.is_unspecified or not listen.is_private):
        where = "every address of the head" if listen.is_unspecified else "a public address"
        found.append(f"metrics.listen: {listen}; Prometheus answers on {where}, unauthenticated")
    if c.env.get(RAY_METRICS, "false").lower() not in ("false", "0"):
        found.append(
            f"env.{RAY_METRICS}: on; each Ray node then exports metrics on a random port of every"
            " address (metrics.ray_port asks for them on a port of its own)"
        )
    if any(_meant(_flag(arg), "--trust-remote-code") for arg in c.vllm.args):
        found.append("vllm.args: --trust-remote-code runs code from the model repository")
    return found
