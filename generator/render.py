"""Config -> the files of every node's folder. Pure: reads only packaged templates and assets."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import jinja2

from generator import __version__, assets
from generator.config import Cluster
from generator.stack import NodeStack


@dataclass(frozen=True)
class File:
    text: str
    mode: int = 0o644


def quote(value: object) -> str:
    """One YAML scalar that means exactly `value`: a JSON string (valid YAML) with every `$`
    doubled, so Compose interpolation leaves it alone and nothing can open a new key or line."""
    return json.dumps(str(value).replace("$", "$$"))


_env = jinja2.Environment(
    loader=jinja2.FileSystemLoader(assets.TEMPLATES),
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=True,
    trim_blocks=True,
    lstrip_blocks=True,
    autoescape=False,
)
_env.filters["q"] = quote


def wrapper_tag(cluster: Cluster) -> str:
    """The wrapper image's tag: changes when the base image or any wrapper file changes."""
    digest = hashlib.sha256(cluster.image.encode())
    for name in assets.IMAGE_FILES:
        digest.update((assets.ROOT / name).read_bytes())
    return f"vllm-compose:{digest.hexdigest()[:12]}"


def node_stacks(cluster: Cluster, source: str) -> list[NodeStack]:
    image = wrapper_tag(cluster)
    return [NodeStack(cluster, node, source, image) for node in cluster.nodes]


def render(cluster: Cluster, source: str) -> dict[str, File]:
    """Relative path -> file, for every node: its compose.yaml and the wrapper's build context."""
    template = _env.get_template("compose.yaml.j2")
    build_context = {name: _asset(name) for name in assets.IMAGE_FILES}
    files: dict[str, File] = {}
    for stack in node_stacks(cluster, source):
        files[f"{stack.node.name}/compose.yaml"] = File(
            template.render(stack=stack, version=__version__)
        )
        files.update({f"{stack.node.name}/{name}": f for name, f in build_context.items()})
    return files


def _asset(name: str) -> File:
    path = assets.ROOT / name
    return File(path.read_text(encoding="utf-8"), 0o755 if path.stat().st_mode & 0o111 else 0o644)
