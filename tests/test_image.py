"""The wrapper image on a real engine, from locally built bases."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from python_on_whales import DockerClient

from generator.stack import assets
from tests.support import images

pytestmark = pytest.mark.engine
ROOT = Path(assets.ROOT)


@pytest.fixture(scope="module")
def docker() -> DockerClient:
    return DockerClient()


def run(docker: DockerClient, *args: str) -> subprocess.CompletedProcess[str]:
    """`docker run --rm ARGS...` (options, the image, its command)."""
    docker_cmd = [*docker.client_config.docker_cmd, "run", "--rm", *args]
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


def test_a_model_symlink_the_container_cannot_follow_is_named_with_its_target(
    docker: DockerClient, tmp_path: Path
) -> None:
    """What `huggingface-cli download --local-dir` once made: files that link into a cache
    outside the model folder. Not dangling on the host; the container cannot see the target."""
    tag = build_wrapper(docker, images.debian_base(docker), "vllm-compose-test/wrapper:noray")
    blob = tmp_path / "cache" / "blob"
    blob.parent.mkdir()
    blob.write_text("{}")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").symlink_to(blob)
    (model / "weights.bin").write_bytes(b"x")
    mount = ["-v", f"{model}:/m:ro", tag, "vllm-compose-health"]
    manifest = run(docker, *mount, "manifest", "/m")
    assert manifest.returncode == 1
    assert manifest.stderr.strip() == (
        f"vllm-compose-health: /m: config.json links to {blob}, which the containers cannot see"
        " (1 such files); copy real files: cp -rL (or sync-model from a node that has them)"
    )
    facts = run(docker, *mount, "facts", "--interface", "lo", "--ip", "127.0.0.1", "--listen",
                "0", "--model", "/m")  # fmt: skip
    assert '"unreachable_links": {"config.json": "' + str(blob) + '"}' in facts.stdout
