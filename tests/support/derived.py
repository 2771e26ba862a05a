"""An image derived from one the nodes already hold, sent as its one new layer.

`docker save` carries every layer of an image: a script added to the 3.9 GB vLLM image is 3.9 GB
to every node. Here the image's archive holds its config, its manifest and the new layer only;
`docker load` reads a layer's file only when the engine lacks that layer, so a node that holds the
base loads it in a second. The bytes are the same for every node, and so is the image's ID.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile

from python_on_whales import DockerClient

from tests.support.testbed import Node

Files = dict[str, tuple[bytes, int]]  # path in the image (no leading /) -> contents, mode


def load(base: str, tag: str, files: Files, nodes: list[Node]) -> str:
    """`tag`: `base` (as the root engine has it, and each node too) with `files` added, loaded
    into every node. Returns its ID."""
    seen = DockerClient().image.inspect(base)
    said = json.loads(
        subprocess.run(
            ["docker", "image", "inspect", "--format", "{{json .Config}}", seen.id],
            capture_output=True,
            check=True,
        ).stdout
    )
    archive, image_id = _archive(
        seen.architecture, seen.os, said, seen.root_fs.layers or [], tag, files
    )
    for node in nodes:
        subprocess.run(
            ["docker", "--context", node.context, "load", "-q"],
            input=archive,
            check=True,
            stdout=subprocess.DEVNULL,
        )
    return image_id


def _archive(
    arch: str, os: str, config: object, layers: list[str], tag: str, files: Files
) -> tuple[bytes, str]:
    new = _tar(files)
    diff = "sha256:" + hashlib.sha256(new).hexdigest()
    image = {"architecture": arch, "os": os, "config": config, "created": "2026-01-01T00:00:00Z",
             "rootfs": {"type": "layers", "diff_ids": [*layers, diff]}}  # fmt: skip
    blob = json.dumps(image, sort_keys=True).encode()
    digest = hashlib.sha256(blob).hexdigest()
    # The base's layers are named, not included: the engine has them and never opens the files.
    named = [f"base{i}/layer.tar" for i in range(len(layers))] + ["new/layer.tar"]
    manifest = [{"Config": f"{digest}.json", "RepoTags": [tag], "Layers": named}]
    archive = _tar(
        {
            f"{digest}.json": (blob, 0o644),
            "new/layer.tar": (new, 0o644),
            "manifest.json": (json.dumps(manifest).encode(), 0o644),
        }
    )
    return archive, f"sha256:{digest}"


def _tar(files: Files) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, (data, mode) in sorted(files.items()):
            entry = tarfile.TarInfo(name)
            entry.size, entry.mode, entry.mtime = len(data), mode, 0
            tar.addfile(entry, io.BytesIO(data))
    return out.getvalue()
