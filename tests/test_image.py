"""The wrapper image on a real engine, from locally built bases."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from python_on_whales import DockerClient

from generator import assets
from tests.support import images

pytestmark = pytest.mark.engine
ROOT = Path(assets.ROOT)


@pytest.fixture(scope="module")
def docker() -> DockerClient:
    return DockerClient()


def run(docker: DockerClient, image: str, *command: str) -> subprocess.CompletedProcess[str]:
    docker_cmd = [*docker.client_config.docker_cmd, "run", "--rm", image, *command]
    return subprocess.run(docker_cmd, capture_output=True, text=True, check=False)


def build_wrapper(docker: DockerClient, base: str, tag: str) -> str:
    docker.legacy_build(ROOT, build_args={"BASE_IMAGE": base}, tags=[tag])
    return tag


@pytest.mark.parametrize(
    ("command", "missing"),
    [
        (["ray", "start", "--head"],
         "'ray' on PATH; use an image with Ray, or set 'backend: native' in the config"),
        (["vllm", "serve", "/m"], "'vllm' on PATH; set 'image' in the config to an image with vLLM"),
    ],
)  # fmt: skip
def test_wrapper_without_a_tool_fails_fast_naming_the_image(
    docker: DockerClient, command: list[str], missing: str
) -> None:
    tag = build_wrapper(docker, images.debian_base(docker), "vllm-compose-test/wrapper:noray")
    result = run(docker, tag, *command)
    assert result.returncode == 127
    assert result.stderr.strip().splitlines() == [f"vllm-compose: {images.DEBIAN} has no {missing}"]


def test_wrapper_over_ray_runs_ray_and_carries_labels(docker: DockerClient) -> None:
    tag = build_wrapper(docker, images.ray_base(docker), "vllm-compose-test/wrapper:ray")
    assert docker.run(tag, ["ray", "--version"], remove=True).strip().endswith("2.58.0")
    labels = docker.image.inspect(tag).config.labels or {}
    assert labels["org.opencontainers.image.base.name"] == images.RAY
    assert labels["io.vllm-compose.wrapper"] == "1"
