"""Helpers for tests that deploy on the testbed: a config for some of its nodes, the CLI as a user
runs it, and the containers a project left on a node."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from python_on_whales import Container, DockerClient

from tests.testbed import IFNAME, MODELS, Node, Testbed

# What the Ray STAND-IN serves (it loads nothing): a model folder with a file, on every node, so
# preflight's model check has something to compare.
STANDIN_MODEL = f"{MODELS}/standin-model"


def place_standin_model(bed: Testbed) -> None:
    for node in bed.nodes:
        folder = Path(node.models) / "standin-model"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text('{"model_type": "stand-in"}\n')
        (folder / "weights.bin").write_bytes(bytes(4096))


def write_config(
    path: Path,
    name: str,
    nodes: list[Node],
    image: str,
    contexts: list[str] | None = None,
    backend: str = "ray",
    model: str = STANDIN_MODEL,
    vllm: str = "{port: 30000}",
    extra: str = "",
) -> Path:
    contexts = contexts or [n.context for n in nodes]
    lines = [
        f"name: {name}",
        f"image: {image}",
        f"backend: {backend}",
        "accelerator: none",
        f"interface: {IFNAME}",
        "nodes:",
        *(
            f"  - {{name: {n.name}, ip: {n.ip}, context: {c}}}"
            for n, c in zip(nodes, contexts, strict=True)
        ),
        f"model: {{path: {model}}}",
        f"vllm: {vllm}",
        *([extra] if extra else []),
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def api_key(config: Path) -> str:
    """The API key `up` generated beside the config."""
    return (config.parent / f"{config.stem}.api-key").read_text().strip()


def cli(*args: str | Path, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "generator", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )


def clean(bed: Testbed, folder: Path) -> None:
    """After a test: `down` every config it wrote in `folder`, then whatever is left on the
    testbed's engines."""
    for config in folder.glob("*.yaml"):
        cli("down", config, cwd=folder)
    bed.remove_containers()


def containers(node: Node, project: str) -> dict[str, Container]:
    docker = DockerClient(context=node.context)
    found = docker.container.list(
        all=True, filters=[("label", f"com.docker.compose.project={project}")]
    )
    return {c.config.labels["com.docker.compose.service"]: c for c in found}


def leftovers(node: Node, project: str) -> list[str]:
    """Containers, volumes and networks of the project still on the node."""
    docker = DockerClient(context=node.context)
    label = [("label", f"com.docker.compose.project={project}")]
    return [
        *(f"container {c.name}" for c in docker.container.list(all=True, filters=label)),
        *(f"volume {v.name}" for v in docker.volume.list(filters=label)),
        *(f"network {n.name}" for n in docker.network.list(filters=label)),
    ]
