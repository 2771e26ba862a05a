"""Config -> the files of every node's folder. Pure: reads only packaged templates and assets."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

import jinja2

from generator import __version__
from generator.config import Cluster
from generator.stack import SECRET_NAMES, NodeStack, assets


@dataclass(frozen=True)
class File:
    text: str
    mode: int = 0o644
    secret: bool = False  # never shown in a diff; its folder is made 0700


# The node folder's files besides compose.yaml and the wrapper's build context.
DOCKERIGNORE = (
    "# The wrapper image's build context is this folder: never send the secrets.\nsecrets\n"
)
GITIGNORE = "# Secret files (vllm-compose render): never commit them.\n*\n"
CONTEXTS_ENV_HEADER = (
    "# Read by `vllm-compose up` (docker compose --env-file contexts.env): the secret files it\n"
    "# writes on the node over its context. By hand, leave it: compose.yaml then uses ./secrets.\n"
)


def quote(value: object) -> str:
    """One YAML scalar that means exactly `value`: a JSON string (valid YAML) with every `$`
    doubled, so Compose interpolation leaves it alone and nothing can open a new key or line.
    Text outside ASCII stays as it is (JSON's surrogate pairs for an emoji are no YAML escape);
    what YAML cannot hold literally (DEL, C1 controls, U+FEFF, U+FFFE/U+FFFF) or would read as a
    line break (U+0085, U+2028, U+2029) is escaped."""
    text = json.dumps(str(value).replace("$", "$$"), ensure_ascii=False)
    return _UNPRINTABLE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


# Outside YAML's printable set, a line break to YAML, or a byte order mark: escaped as \uXXXX.
_UNPRINTABLE = re.compile("[\x7f-\x9f\u2028\u2029\ufeff\ufffe\uffff]")


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
    """Every node's stack, as a node of its replica (the cluster's one group, without)."""
    image = wrapper_tag(cluster)
    return [NodeStack(g, node, source, image) for g in cluster.groups for node in g.nodes]


def render(cluster: Cluster, source: str, secrets: dict[str, str] | None = None) -> dict[str, File]:
    """Relative path -> file, for every node: its compose.yaml, the wrapper's build context,
    contexts.env, and (given `secrets`: name -> contents) the secret files its stack uses, so
    that the folder alone starts with `docker compose up -d`."""
    template = _env.get_template("compose.yaml.j2")
    build_context = {name: _asset(name) for name in assets.IMAGE_FILES}
    files: dict[str, File] = {}
    for stack in node_stacks(cluster, source):
        folder = stack.node.name
        files[f"{folder}/compose.yaml"] = File(template.render(stack=stack, version=__version__))
        files.update({f"{folder}/{name}": f for name, f in build_context.items()})
        files[f"{folder}/.dockerignore"] = File(DOCKERIGNORE)
        files[f"{folder}/contexts.env"] = File(CONTEXTS_ENV_HEADER + stack.contexts_env)
        files.update(_secret_files(stack, secrets))
    return files


def _secret_files(stack: NodeStack, secrets: dict[str, str] | None) -> dict[str, File]:
    folder = f"{stack.node.name}/secrets"
    found = {
        f"{folder}/{SECRET_NAMES[name]}": File(secrets[name], 0o600, secret=True)
        for name in stack.used_secrets
        if secrets and name in secrets
    }
    return found | {f"{folder}/.gitignore": File(GITIGNORE, 0o600, secret=True)} if found else {}


def _asset(name: str) -> File:
    path = assets.ROOT / name
    return File(path.read_text(encoding="utf-8"), 0o755 if path.stat().st_mode & 0o111 else 0o644)
