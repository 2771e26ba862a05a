"""What the served model says of itself, asked inside the head's serve container: its context
length, and vLLM's load and counters from its /metrics."""

from __future__ import annotations

import json

from python_on_whales import DockerException

from generator.base import probes
from generator.base.errors import PhaseError, reason
from generator.config import ports
from generator.nodes.fleet import Fleet


def context(fleet: Fleet, phase: str) -> int | None:
    """The served model's max_model_len: the config's, else what vLLM's /v1/models says."""
    c = fleet.cluster
    if c.vllm.max_model_len:
        return c.vllm.max_model_len
    try:
        said = json.loads(fleet.execute(fleet.head, "serve", probes.models(ports.vllm(c))))
    except DockerException as e:
        raise PhaseError(fleet.head.name, phase, f"/v1/models: {reason(e)}") from None
    limit = said.get(c.served_model_name)
    return int(limit) if limit else None


def load(fleet: Fleet) -> dict[str, float] | None:
    """vLLM's load and counters now (image/health.py's LOAD: requests running and waiting,
    tokens, KV-cache use, prefix-cache lookups and hits); None when /metrics did not answer."""
    try:
        said = fleet.execute(fleet.head, "serve", probes.metrics(ports.vllm(fleet.cluster)))
    except DockerException:
        return None
    found: dict[str, float] = json.loads(said)
    return found
