"""TEST-ONLY vLLM platform plugin, installed only in the test image (tests/images.py).

vLLM's CPU platform refuses the Ray executor ("current platform cpu does not support ray")
because `CpuPlatform.ray_device_key` is empty. This subclass names the Ray resource the testbed's
nodes declare (`ray start --num-gpus N`, from `nodes[].gpus`), so vLLM's real Ray executor runs
on CPU: placement group, Ray worker actors, the same code path as on GPU nodes. An out-of-tree
platform plugin wins over the built-in ones (vllm/platforms/__init__.py), so it must never be
installed anywhere but the test image.
"""

from vllm.platforms.cpu import CpuPlatform


class CpuRayPlatform(CpuPlatform):
    ray_device_key: str = "GPU"


def register() -> str:
    return "vllm_test_platform.CpuRayPlatform"
