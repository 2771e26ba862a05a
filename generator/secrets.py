"""Secret files: found (or, for the API key, made) beside the config, then written onto each node
over its context, so a remote engine finds them on its own side.

The contents travel only as a file copied into a container (`docker cp`), into a file of mode 0600
in a folder of mode 0700 on the node (stack.SECRETS_DIR); never as an argument, an environment
variable or a log line.
"""

from __future__ import annotations

import os
import secrets as random_secrets
from dataclasses import dataclass
from pathlib import Path

from python_on_whales import DockerClient, DockerException

from generator.config import Cluster
from generator.errors import DockerError, VllmComposeError
from generator.stack import SECRET_NAMES, SECRETS_DIR, secret_names


@dataclass(frozen=True)
class Local:
    files: dict[str, Path]  # secret name -> file beside the config
    generated: dict[str, Path]  # secret name -> its file, made just now
    missing: dict[str, Path]  # secret name -> its file, not made (generate=False)


def local(config: Path, cluster: Cluster, generate: bool = True) -> Local:
    """The secret files beside the config. The API key (and Ray's token, with the Ray backend)
    default to CONFIG-STEM.api-key (.ray-token), generated (mode 0600) when missing, unless
    `generate` is False (a dry run): then they are listed as missing."""
    folder = config.resolve().parent
    files: dict[str, Path] = {}
    generated: dict[str, Path] = {}
    missing: dict[str, Path] = {}
    made = {"api_key": cluster.secrets.api_key_file}
    if "ray_token" in secret_names(cluster):
        made["ray_token"] = cluster.secrets.ray_token_file
    for name, named in made.items():
        path = folder / (named or f"{config.stem}.{SECRET_NAMES[name]}")
        if not path.exists():
            if named:
                raise VllmComposeError(
                    f"secrets.{name}_file: {path} does not exist",
                    "write it there (one line), or drop the setting to have one generated",
                )
            if not generate:
                missing[name] = path
                continue
            # O_EXCL: never overwrites; 0600 from the first byte.
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(random_secrets.token_urlsafe(32))  # no newline: read as is
            generated[name] = path
        files[name] = path
    if cluster.secrets.hf_token_file:
        token = folder / cluster.secrets.hf_token_file
        if not token.exists():
            raise VllmComposeError(f"secrets.hf_token_file: {token} does not exist")
        files["hf_token"] = token
    for path in files.values():
        if path.stat().st_mode & 0o077:
            raise VllmComposeError(
                f"{path} can be read by other users (mode {path.stat().st_mode & 0o777:o})",
                f"chmod 600 {path}",
            )
    return Local(files, generated, missing)


def push(
    docker: DockerClient, node: str, cluster: str, image: str, files: dict[str, Path]
) -> dict[str, float]:
    """Write each secret onto the node at stack.secret_path (mode 0600, folder 0700): the files
    are copied into a short-lived container that mounts the node's folder (`docker cp`, like a
    file, never an argument), which then moves them into place under their names; a file whose
    contents are already there is left as it was. Returns each secret's time of last change on
    the node (its mtime, node clock): a container started before it has the old one."""
    if not files:
        return {}
    # A temporary name of its own per file: two writers of one folder (nodes sharing a
    # filesystem) never rename each other's file.
    partial = {name: f".{SECRET_NAMES[name]}.{random_secrets.token_hex(8)}" for name in files}
    script = f"chmod 700 /s && chmod 600 {' '.join(f'/s/{t}' for t in partial.values())}"
    for name in files:
        new, old = f"/s/{partial[name]}", f"/s/{SECRET_NAMES[name]}"
        # Only the name and a time are printed, never the contents. Without cmp: changed.
        script += f" && {{ if [ -e {old} ] && cmp -s {new} {old}; then rm -f {new};"
        script += f" else mv {new} {old} && touch {old}; fi; }}"
        script += f' && echo "changed:{name}:$(stat -c %Y {old})"'
    folder = f"{SECRETS_DIR}/{cluster}"
    try:
        writer = docker.container.create(
            image, ["-c", script], entrypoint="sh", volumes=[(folder, "/s")]
        )
        try:
            for name, path in files.items():
                docker.copy(path, (writer, f"/s/{partial[name]}"))
            said = str(docker.container.start(writer, attach=True) or "")
        finally:
            docker.container.remove(writer, force=True)
    except DockerException as e:
        raise DockerError.wrap(node, f"writing the {', '.join(files)} file failed", e) from None
    stamps = [line.split(":") for line in said.split() if line.startswith("changed:")]
    return {name: float(when) for _, name, when in stamps}
