"""The services of one node's stack: the Ray head and serve, a Ray worker, or a native rank;
their commands, healthchecks, volumes, secrets and configs. Built from a NodeStack."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from generator.base import probes
from generator.config import ports
from generator.stack import doorfiles

if TYPE_CHECKING:
    from generator.config import Node
    from generator.stack import NodeStack

# The head's temp folder, shared by its Ray container and serve: Ray's session (plasma and raylet
# sockets, FAILURES #13) and vLLM's local ZMQ ipc:// sockets (VLLM_RPC_BASE_PATH) between the
# driver in serve and its rank-0 Ray worker in the Ray container. Without it both wait forever
# after the weights load, with no error.
SHARED_TMP = "/tmp"


@dataclass(frozen=True)
class Health:
    test: list[str]
    start_period: int
    interval: int = 5
    timeout: int = 30
    retries: int = 3


@dataclass(frozen=True)
class Service:
    name: str
    command: list[str]
    health: Health | None
    depends_on: str | None = None
    # Ray >= 2.5x finds the local raylet by scanning processes: a driver in another container must
    # see the head's processes, not only its /tmp/ray sockets (FAILURES #13).
    pid_of: str | None = None
    volumes: list[str] = field(default_factory=list)  # named volumes, "name:/path"
    environment: dict[str, str] = field(default_factory=dict)
    model: str | None = None  # mounted read-only at the same path (see model_mount)
    secrets: list[str] = field(default_factory=list)  # names of SECRET_NAMES
    configs: list[tuple[str, str]] = field(default_factory=list)  # (NodeStack.configs name, target)
    fingerprint: str = ""  # set by NodeStack.services (see _fingerprint)


def own(stack: NodeStack) -> list[Service]:
    """The node's services, before the stack adds its environment and model mount."""
    if stack.cluster.backend == "native":
        return [_native_serve(stack)]
    return [_ray_head(stack), _serve(stack)] if stack.is_head else [_ray_worker(stack)]


def sharing(services: list[Service], names: list[str]) -> list[str]:
    """The services in a named one's process namespace (pid_of) that are not named themselves."""
    return [s.name for s in services if s.pid_of in names and s.name not in names]


def _ray_start(stack: NodeStack) -> list[str]:
    c = stack.cluster
    cmd = ["ray", "start", "--block", "--node-ip-address", str(stack.node.ip)]
    cmd += ["--num-gpus", str(stack.node.gpus), "--disable-usage-stats"]
    store = c.ray.object_store_memory or c.settings.object_store_memory
    if store:
        cmd += ["--object-store-memory", str(store)]
    if c.metrics and c.metrics.ray_port:
        cmd += ["--metrics-export-port", str(c.metrics.ray_port)]
    # Every port of Ray's named, from the cluster's slot: another cluster's Ray on the node has
    # its own (Ray would pick some at random, and others fixed that both would want).
    for option, port in ports.ray_internal(c, stack.is_head).items():
        cmd += [option, str(port)]
    return cmd


def _ray_head(stack: NodeStack) -> Service:
    c = stack.cluster
    cmd = [*_ray_start(stack), "--head", "--port", str(ports.ray_gcs(c))]
    if c.ray.dashboard:
        cmd += ["--include-dashboard=true", "--dashboard-host", str(stack.node.ip)]
        cmd += ["--dashboard-port", str(ports.ray_dashboard(c))]
    else:
        cmd += ["--include-dashboard=false"]
    everyone = [str(n.ip) for n in c.nodes]
    test = ["CMD", *probes.ray(stack.gcs_address, everyone, c.gpu_total)]
    return Service(
        "ray",
        cmd,
        _ray_health(test),
        environment=group(stack, listen=True),
        volumes=[f"shared-tmp:{SHARED_TMP}"],
        secrets=_ray_secrets(stack),
        configs=stack.config_targets,
    )


def _ray_worker(stack: NodeStack) -> Service:
    cmd = [*_ray_start(stack), "--address", stack.gcs_address]
    test = ["CMD", *probes.ray(stack.gcs_address, [str(stack.node.ip)])]
    env = {"VLLM_COMPOSE_WAIT_FOR": stack.gcs_address, **group(stack, listen=True)}
    return Service(
        "ray",
        cmd,
        _ray_health(test),
        environment=env,
        secrets=_ray_secrets(stack),
        configs=stack.config_targets,
    )


def _ray_health(test: list[str]) -> Health:
    # Nothing waits on it (serve starts with Ray; `up` and `watch` ask the GCS themselves): every
    # 15 s, so its Python start and GCS read do not compete with the model load for CPU.
    return Health(test, start_period=300, interval=15)


def _serve_secrets(stack: NodeStack) -> list[str]:
    """Every secret but the front door's files (the door alone reads them)."""
    return [name for name in stack.secrets if name not in doorfiles.FILES]


def _ray_secrets(stack: NodeStack) -> list[str]:
    return ["ray_token"] if "ray_token" in stack.secrets else []


def _serve(stack: NodeStack) -> Service:
    cmd = [
        *_vllm_serve(stack),
        "--distributed-executor-backend",
        "ray",
        *stack.cluster.vllm.args,
    ]
    return Service(
        "serve",
        cmd,
        _serve_health(stack),
        depends_on="ray",
        pid_of="ray",
        volumes=[f"shared-tmp:{SHARED_TMP}"],
        # Every worker's lines in serve's log, each naming its node: Ray would drop the lines
        # one worker logs like another (the same load, the same error on every node).
        environment={
            "RAY_ADDRESS": stack.gcs_address,
            "RAY_DEDUP_LOGS": "0",
            **group(stack, members=True),
            **canary(stack),
        },
        secrets=_serve_secrets(stack),
        configs=stack.config_targets,
    )


# Native backend


def _native_serve(stack: NodeStack) -> Service:
    c = stack.cluster
    cmd = [*_vllm_serve(stack), "--nnodes", str(len(c.nodes)), "--node-rank", str(_rank(stack))]
    cmd += ["--master-addr", str(c.head.ip), "--master-port", str(ports.master(c))]
    secrets = _serve_secrets(stack)
    env = group(stack, listen=True, members=True)
    if stack.is_head:
        return Service(
            "serve",
            [*cmd, *c.vllm.args],
            _serve_health(stack),
            environment={**env, **canary(stack)},
            secrets=secrets,
        )
    # A headless rank has no API to probe; the head's completion gate proves it works.
    cmd = [*cmd, "--headless", *c.vllm.args]
    return Service("serve", cmd, None, environment=env, secrets=secrets)


def _rank(stack: NodeStack) -> int:
    """The head is rank 0; workers follow in config order."""
    return [stack.cluster.head, *stack.cluster.workers].index(stack.node)


# Shared


def group(stack: NodeStack, listen: bool = False, members: bool = False) -> dict[str, str]:
    """How the service keeps in step with the other nodes (image/group.py): the head's first
    service is the root, the others follow it; `listen` publishes this node's start, `members`
    (on the head) follows the workers' too."""
    c = stack.cluster

    def at(node: Node) -> str:
        return f"{node.ip}:{ports.group(c)}"

    env = {"VLLM_COMPOSE_GROUP_GRACE": str(c.group.grace)}
    if listen:
        env["VLLM_COMPOSE_GROUP_LISTEN"] = at(stack.node)
    if not (stack.is_head and listen):
        env["VLLM_COMPOSE_GROUP_ROOT"] = at(c.head)
    if stack.is_head and members and c.workers:
        env["VLLM_COMPOSE_GROUP_MEMBERS"] = ",".join(at(n) for n in c.workers)
    return env


def canary(stack: NodeStack) -> dict[str, str]:
    """The head serve's own check for a hung rank (image/canary.py), when it is on; and behind
    the front door, vLLM takes no key of its own (the entrypoint reads this)."""
    c = stack.cluster
    door = {"VLLM_COMPOSE_FRONT_DOOR": "1"} if c.front_door.enabled else {}
    if not c.group.hang_after:
        return door
    said = f"{c.group.hang_after} {ports.vllm(c)} {c.served_model_name}"
    return door | {"VLLM_COMPOSE_CANARY": said}


def _vllm_serve(stack: NodeStack) -> list[str]:
    c, v = stack.cluster, stack.cluster.vllm
    utilization = v.gpu_memory_utilization or c.settings.gpu_memory_utilization
    cmd = ["vllm", "serve", c.model.path]
    cmd += ["--tensor-parallel-size", str(c.tensor_parallel_size)]
    cmd += ["--pipeline-parallel-size", str(v.pipeline_parallel_size)]
    cmd += ["--gpu-memory-utilization", str(utilization), "--port", str(ports.vllm(c))]
    if c.front_door.enabled:
        cmd += ["--host", "127.0.0.1"]  # clients reach it through the front door only
    if v.max_model_len:
        cmd += ["--max-model-len", str(v.max_model_len)]
    if v.served_model_name:
        cmd += ["--served-model-name", v.served_model_name]
    strategy = v.safetensors_load_strategy or c.settings.safetensors_load_strategy
    if strategy:
        cmd += ["--safetensors-load-strategy", strategy]
    return cmd


def _serve_health(stack: NodeStack) -> Health:
    c = stack.cluster
    test = ["CMD", *probes.serve(ports.vllm(c), c.served_model_name)]
    # Every check is a real completion: every 15 s, not 5, so checks do not compete with the
    # model load for CPU, nor with traffic later. `up` does not wait on it (it probes itself).
    return Health(test, start_period=c.vllm.startup_timeout, interval=15)
