"""The API port of a config that names none (`vllm.port` unset), and so its slot (ports.py):
where its cluster runs now; else the first slot whose ports are free on every one of its nodes
beside the clusters running there. A lock records the port picked, so that the config renders the
same stacks again (lock.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from generator.config import ports
from generator.stack import claims

if TYPE_CHECKING:
    from generator.config import Cluster

DEFAULT = 8000  # the API port of slot 0


def given(c: Cluster) -> bool:
    """Does the config name its API port?"""
    return "port" in c.vllm.model_fields_set


def at(c: Cluster, port: int) -> Cluster:
    """The cluster with its API port set (and so given)."""
    return c.model_copy(update={"vllm": c.vllm.model_copy(update={"port": port})})


def placed(c: Cluster, seen: dict[str, dict[str, claims.Claim]]) -> tuple[Cluster, str | None]:
    """seen: node -> cluster -> claim, the clusters running on each of the cluster's nodes. The
    cluster at its API port, and why that is not the default one (None when it is)."""
    if given(c):
        return c, None
    for claim in (on[c.name] for on in seen.values() if c.name in on):
        running = claim.ports.get("vllm.port")
        if running:
            return at(c, running.start), None
    taken: set[str] = set()
    for k in range(ports.SLOTS):
        candidate = at(c, DEFAULT + k)
        clashing = {
            o.cluster
            for on in seen.values()
            for o in on.values()
            if o.cluster != c.name and claims.port_clashes(candidate, [o])
        }
        if not clashing:
            if not taken:
                return candidate, None
            names = ", ".join(f"'{name}'" for name in sorted(taken))
            return (
                candidate,
                f"API port {DEFAULT + k} (slot {k}): the slots below are taken by {names}",
            )
        taken |= clashing
    return c, None  # every slot taken: preflight names the clash
