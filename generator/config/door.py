"""The `front_door` section: HAProxy on the head, in front of the cluster's vLLM (stack/frontdoor.py
writes its configuration)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from generator.config import sections
from generator.config.sections import Strict, seconds


class FrontDoor(Strict):
    enabled: bool = Field(
        default=True,
        description="Clients reach vLLM through the front door, on `vllm.port`; vLLM itself "
        "listens on the head's loopback only. Off: vLLM answers on `vllm.port` itself.",
    )
    image: str = sections.image(
        "haproxy:3.2",
        "HAProxy image the front door runs (2.6 or later; from 3.0 on it ends a stream the model"
        " server broke off with an error event).",
    )
    hold: int = seconds(
        120,
        0,
        3600,
        "Tries for a request with no answer yet, held and sent again a second apart (so as "
        "many seconds) while its cluster recovers, upgrades or reboots: vLLM's port refusing "
        "connections, answering nothing or as a dead engine does; then a 503 with Retry-After.",
    )
    requests_per_minute: int = Field(
        default=0, ge=0, le=1_000_000, description="Per key: requests a minute (0: no limit)."
    )
    concurrency: int = Field(
        default=0, ge=0, le=100_000, description="Per key: requests at once (0: no limit)."
    )
    balance: Literal["leastconn", "prefix"] = Field(
        default="leastconn",
        description="How the door shares requests between replicas: `leastconn`, to the one with "
        "the fewest at once; `prefix`, by a hash of the request's first 256 bytes (its model and "
        "the start of its prompt), so that a shared prefix meets its cache, no replica taking over "
        "1.25x the mean load.",
    )
