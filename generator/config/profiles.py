"""Named sets of defaults for a kind of hardware. A config's explicit value always wins.

Each default carries the reason it exists; ../shared/FAILURES.md rows are cited by number.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ProfileName = Literal["generic", "dgx-spark"]


@dataclass(frozen=True)
class Profile:
    gpu_memory_utilization: float
    # Ray's object store takes 30% of RAM by default; on unified-memory machines that is memory
    # the GPU needs. None leaves Ray's default.
    object_store_memory: int | None = None
    safetensors_load_strategy: str | None = None
    devices: tuple[str, ...] = ()
    cap_add: tuple[str, ...] = ()
    memlock_unlimited: bool = False


PROFILES: dict[str, Profile] = {
    # vLLM's own default utilisation; nothing hardware-specific.
    "generic": Profile(gpu_memory_utilization=0.9),
    "dgx-spark": Profile(
        # GB10 shares 128 GB between CPU and GPU: leave room for the OS and Ray (NVIDIA's DGX Spark
        # vLLM playbook and the field deployment both settled on 0.85).
        gpu_memory_utilization=0.85,
        # Cap Ray's object store at 8 GiB so it does not claim 30% of unified memory (FAILURES #6).
        object_store_memory=8 * 1024**3,
        # mmap'd safetensors load ~6x slower on the Spark: 8m41s vs 1m28s for an 80B FP8 model
        # (FAILURES #19); the flag exists in vLLM >= 0.11.
        safetensors_load_strategy="eager",
        # RDMA without --privileged: the verbs devices, pinned memory (FAILURES #4).
        devices=("/dev/infiniband:/dev/infiniband",),
        cap_add=("IPC_LOCK",),
        memlock_unlimited=True,
    ),
}
