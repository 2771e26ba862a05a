"""What one node runs: services, commands, environment and gates, derived from the config.

Templates only read these values; every decision about the stack is made here.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, replace
from functools import cached_property

from generator.config import MEMORY_MONITOR, PER_NODE_HARDWARE_ENV, Cluster, Node, ports
from generator.config.mounts import model_mount
from generator.stack import claims, doorcounts, doorfiles, frontdoor, monitoring, services
from generator.stack.services import Service

# Secret files, mounted by Compose at /run/secrets/<name> in the services that use them (the API
# key in serve, Ray's token in every Ray service and serve). compose.yaml names them as
# ${SECRETS_ENV:-./secrets}/<file>: by hand, the copies in the node's own folder; under
# `vllm-compose up`, which passes contexts.env, the files it wrote on the node over its context.
SECRETS_DIR = "/var/lib/vllm-compose"
SECRETS_ENV = "VLLM_COMPOSE_SECRETS"
SECRET_NAMES = {
    "api_key": "api-key",
    "hf_token": "hf-token",
    "ray_token": "ray-token",
    "front_door_keys": "front-door-keys",
    "front_door_routes": "front-door-routes",
    "front_door_models": "front-door-models.json",
    "front_door_peer_key": "front-door-peer-key",
    "front_door_peers": "front-door-peers",
}


def secrets_folder(cluster: str) -> str:
    """Where `vllm-compose up` writes a cluster's secret files on each node (nodes/secrets.py)."""
    return f"{SECRETS_DIR}/{cluster}"


# vLLM's Ray executor copies the driver's NCCL_*, VLLM_* and HF_* variables to every worker
# unless this file under VLLM_CONFIG_ROOT names them (vllm/ray/ray_env.py): the per-node ones.
CARRY_OVER_FILE = "ray_non_carry_over_env_vars.json"
VLLM_CONFIG_ROOT = "/etc/vllm-compose/vllm"
# Compile caches, kept in a named volume per node so that a start after a recreate, a recovery,
# an upgrade or a reboot finds what the last one compiled: vLLM's torch.compile cache, Inductor's,
# Triton's, FlashInfer's (under its workspace base) and CUDA's JIT cache.
CACHE = "/var/cache/vllm-compose"
CACHE_ENV = {
    "VLLM_CACHE_ROOT": f"{CACHE}/vllm",
    "TORCHINDUCTOR_CACHE_DIR": f"{CACHE}/inductor",
    "TRITON_CACHE_DIR": f"{CACHE}/triton",
    "FLASHINFER_WORKSPACE_BASE": f"{CACHE}/flashinfer",
    "CUDA_CACHE_PATH": f"{CACHE}/cuda",
}


def secret_source(name: str) -> str:
    """The secret's file as compose.yaml names it (interpolated by Compose)."""
    return f"${{{SECRETS_ENV}:-./secrets}}/{SECRET_NAMES[name]}"


def secret_names(cluster: Cluster) -> list[str]:
    """The cluster's secrets: the API key always (serving is authenticated); Ray's token with the
    Ray backend and its token authentication; the HF token when the config names one."""
    names = ["api_key"]
    names += ["ray_token"] if cluster.backend == "ray" and cluster.ray.token_auth else []
    names += list(doorfiles.FILES) if cluster.front_door.enabled else []
    return names + (["hf_token"] if cluster.secrets.hf_token_file else [])


@dataclass(frozen=True)
class NodeStack:
    cluster: Cluster
    node: Node
    source: str  # the config file's name, for the header
    image: str  # the wrapper image tag

    @property
    def is_head(self) -> bool:
        return self.node == self.cluster.head

    @property
    def runs_prometheus(self) -> bool:
        return self.is_head and self.cluster.runs_prometheus

    @property
    def role(self) -> str:
        return "head" if self.is_head else "worker"

    @property
    def gcs_address(self) -> str:
        return f"{self.cluster.head.ip}:{ports.ray_gcs(self.cluster)}"

    @property
    def per_node_environment(self) -> dict[str, str]:
        """What differs from node to node: each rank must keep its own node's values."""
        interface = self.cluster.interface_of(self.node)
        return {
            "VLLM_HOST_IP": str(self.node.ip),
            "NCCL_SOCKET_IFNAME": interface,
            "GLOO_SOCKET_IFNAME": interface,
        }

    @property
    def carry_over_exclusions(self) -> str:
        """The JSON list vLLM's Ray executor reads to leave these variables to each worker's own
        node: ours per node, and the NCCL ones a node's hardware decides."""
        names = [*self.per_node_environment, *PER_NODE_HARDWARE_ENV]
        return json.dumps(names)

    @property
    def environment(self) -> dict[str, str]:
        """Ours first, then the user's: per-node values cannot be overridden (config rejects it)."""
        env = self.per_node_environment | CACHE_ENV
        if self.cluster.backend == "ray":
            env["VLLM_CONFIG_ROOT"] = VLLM_CONFIG_ROOT
            # Ray's memory monitor kills workers during weight load on unified memory (FAILURES #6);
            # it must be off on every node, not only the head. The user may override it (warned).
            env[MEMORY_MONITOR] = "0"
            env["RAY_USAGE_STATS_ENABLED"] = "0"
            # On SIGTERM, Ray 2.58 first drains its node for up to 30 s, for Ray Serve's
            # replicas; vLLM is stopped before Ray, so `down` and a group restart wait for
            # nothing: Ray stops at once instead of at the 20 s kill (image/stopping.py).
            env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] = "0"
            env |= ports.ray_environment(self.cluster)
            if self.cluster.ray.token_auth:
                # Ray binds its GCS and node ports to every address (2.58 was seen on *:6379
                # despite --node-ip-address): only holders of the token get an answer. The
                # entrypoint links the token's secret file where Ray looks by default.
                env["RAY_AUTH_MODE"] = "token"
        return env | dict(self.cluster.env)

    @property
    def secrets(self) -> dict[str, str]:
        """Secret name -> its file as compose.yaml names it (see `secret_names`)."""
        return {name: secret_source(name) for name in secret_names(self.cluster)}

    @property
    def used_secrets(self) -> dict[str, str]:
        used = {name for s in self.services for name in s.secrets}
        used |= {name for s in self.sidecars for name in s.secrets}
        return {name: path for name, path in self.secrets.items() if name in used}

    @property
    def contexts_env(self) -> str:
        """contexts.env: what `vllm-compose up` passes to Compose (--env-file)."""
        return f"{SECRETS_ENV}={secrets_folder(self.cluster.name)}\n"

    @property
    def configs(self) -> dict[str, str]:
        """Compose configs (name -> content), copied into the containers at create."""
        found = (
            {"vllm-ray-env": self.carry_over_exclusions} if self.cluster.backend == "ray" else {}
        )
        if self.runs_prometheus:
            found[monitoring.PROMETHEUS_CONFIG] = monitoring.prometheus_config(self.cluster)
        if self.cluster.metrics and self.cluster.accelerator == "nvidia":
            found[monitoring.DCGM_COUNTERS] = monitoring.dcgm_counters()
        if self.cluster.front_door.enabled and self.is_head:
            found |= frontdoor.configs(self.cluster)
        return found | doorcounts.configs(self)

    @property
    def config_targets(self) -> list[tuple[str, str]]:
        """(config, target) for each Ray service."""
        ray = self.cluster.backend == "ray"
        return [("vllm-ray-env", f"{VLLM_CONFIG_ROOT}/{CARRY_OVER_FILE}")] if ray else []

    @property
    def labels(self) -> dict[str, str]:
        return {
            "io.vllm-compose.cluster": self.cluster.name,
            "io.vllm-compose.node": self.node.name,
            "io.vllm-compose.role": self.role,
            claims.CONFIG: self.source,
            **claims.labels(self.cluster),
        }

    @cached_property
    def services(self) -> list[Service]:
        own = services.own(self)
        model = model_mount(self.cluster.model.path)
        cache = f"{self.cache_volume}:{CACHE}"
        done = [
            replace(s, environment=self.environment | s.environment, model=model,
                    volumes=[*s.volumes, cache])
            for s in own
        ]  # fmt: skip
        return [replace(s, fingerprint=self._fingerprint(s)) for s in done]

    @cached_property
    def sidecars(self) -> list[monitoring.Sidecar]:
        """Services beside the group (the `metrics` section's), each with its fingerprint."""
        found = monitoring.sidecars(self) + frontdoor.sidecars(self) + doorcounts.sidecars(self)
        # Its own image and settings, and its configs' contents (a changed prometheus.yml must
        # recreate Prometheus); not the group's image: an upgrade of vLLM leaves the front door
        # running, holding requests through it.
        return [
            replace(s, fingerprint=_hashed([asdict(s), *(self.configs[n] for n, _ in s.configs)]))
            for s in found
        ]

    def _fingerprint(self, service: Service) -> str:
        """Hash of everything a service is rendered from. Its label changes only when the
        service does, so `compose up` after a config change recreates just what changed."""
        shape = [
            asdict(service),
            self.image,
            self.cluster.image,
            self.cluster.accelerator,
            self.devices,
            self.cap_add,
            self.memlock_unlimited,
        ]
        return _hashed(shape)

    # What the template reads, each a plain value

    @property
    def project(self) -> str:
        return self.cluster.name

    @property
    def base_image(self) -> str:
        return self.cluster.image

    @property
    def config_hash(self) -> str:
        return self.cluster.config_hash()

    @property
    def devices(self) -> tuple[str, ...]:
        return self.cluster.settings.devices

    @property
    def cap_add(self) -> tuple[str, ...]:
        return self.cluster.settings.cap_add

    @property
    def memlock_unlimited(self) -> bool:
        return self.cluster.settings.memlock_unlimited

    @property
    def all_gpus(self) -> bool:
        """Hand the node's GPUs to every container (NVIDIA runtime)."""
        return self.cluster.accelerator == "nvidia"

    @property
    def cache_volume(self) -> str:
        """The compile caches' volume, named by the image as the config names it and the model:
        another image or model starts with an empty cache, and locking the image to its ID (as
        `upgrade` does) keeps the cache. Under one tag rebuilt with another vLLM or torch, their
        own cache keys (which hash their versions) keep the old entries apart."""
        key = json.dumps([self.cluster.configured_image, self.cluster.model.path])
        return f"compile-cache-{hashlib.sha256(key.encode()).hexdigest()[:12]}"

    @property
    def named_volumes(self) -> list[str]:
        shared = ["shared-tmp"] if self.cluster.backend == "ray" and self.is_head else []
        metrics = [monitoring.PROMETHEUS_DATA] if self.runs_prometheus else []
        return [*shared, self.cache_volume, *metrics]


def _hashed(shape: list[object]) -> str:
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()
