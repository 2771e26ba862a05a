"""TEST-ONLY vLLM platform plugin, installed only in the test image (tests/support/images.py).

vLLM's CPU platform refuses the Ray executor ("current platform cpu does not support ray")
because `CpuPlatform.ray_device_key` is empty. This subclass names the Ray resource the testbed's
nodes declare (`ray start --num-gpus N`, from `nodes[].gpus`), so vLLM's real Ray executor runs
on CPU: placement group, Ray worker actors, the same code path as on GPU nodes.

Its communicator fixes one more CPU-only assumption: vLLM's CPU build all-reduces through a
shared-memory segment whenever every rank of a group computes the same segment name, and under
Ray every rank does (the name comes from the rendezvous port), so the rank on the second node
fails with "open shm in SHMManager failed. errno: 2". Here the name carries the node's IP:
ranks on different nodes disagree and vLLM falls back to torch.distributed (Gloo), as it is
built to. On GPUs NCCL does this job and none of it applies.

An out-of-tree platform plugin wins over the built-in ones (vllm/platforms/__init__.py), so it
must never be installed anywhere but the test image.
"""

from typing import Any

from vllm.platforms.cpu import CpuPlatform


class CpuRayPlatform(CpuPlatform):
    ray_device_key: str = "GPU"

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        return "vllm_test_platform.NodeLocalShmCpuCommunicator"


def register() -> str:
    return "vllm_test_platform.CpuRayPlatform"


def __getattr__(name: str) -> Any:
    # Defined on first use: importing vLLM's communicator needs the platform resolved first.
    if name != "NodeLocalShmCpuCommunicator":
        raise AttributeError(name)
    import torch
    from vllm.distributed.device_communicators.cpu_communicator import (
        CpuCommunicator,
        _CPUSHMDistributed,
    )
    from vllm.utils.network_utils import get_ip

    class NodeLocalShmCpuCommunicator(CpuCommunicator):
        def _all_group_ranks_share_shm_group_name(self) -> bool:
            local = f"{_CPUSHMDistributed.make_group_name(self)}@{get_ip()}"
            names: list[str] = [""] * self.world_size
            torch.distributed.all_gather_object(names, local, group=self.device_group)
            return len(set(names)) == 1

    globals()[name] = NodeLocalShmCpuCommunicator
    return NodeLocalShmCpuCommunicator
