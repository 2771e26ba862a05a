"""Secret files: found (or, for the API key, made) in the config's state folder, then written onto
each node over its context, so a remote engine finds them on its own side.

The contents travel only as a tar archive on a short-lived container's standard input, into a file
of mode 0600 in a folder of mode 0700 on the node (stack.secrets_folder); never as an argument, an
environment variable or a log line.
"""

from __future__ import annotations

import io
import os
import secrets as random_secrets
import stat
import subprocess
import tarfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from python_on_whales import DockerClient, DockerException
from python_on_whales.utils import run

from generator.base import sidefiles
from generator.base.errors import DockerError, SecretFileError
from generator.config import Cluster
from generator.nodes import doorlocal
from generator.stack import SECRET_NAMES, doorfiles, secret_names, secrets_folder

# Read by their containers each time they are used, so written in place (a bind-mounted file's
# new inode would stay unseen): behind the front door, none restarts a service.
IN_PLACE = (*doorfiles.FILES, "api_key")


@dataclass(frozen=True)
class Local:
    files: dict[str, Path]  # secret name -> its file on this machine
    generated: dict[str, Path]  # secret name -> its file, made just now
    missing: dict[str, Path]  # secret name -> its file, not made (generate=False)


def local(config: Path, cluster: Cluster, generate: bool = True) -> Local:
    """The secret files the config names (relative to it, or absolute). The API key (and Ray's
    token, with the Ray backend) default to api-key (ray-token) in the config's state folder,
    generated (mode 0600) when missing, unless `generate` is False (a dry run): then they are
    listed as missing."""
    folder = config.resolve().parent
    found = Local({}, {}, {})
    if doorlocal.DOOR_KEYS in secret_names(cluster):
        doorlocal.readable(config)  # before any secret is generated
    named = _given(config, cluster)
    for name in secret_names(cluster):
        if name in doorfiles.FILES:
            continue  # made (doorlocal)
        given = named[name]
        path = given or _default(folder / config.name, name)
        if path.exists():
            found.files[name] = path
        elif given or name == "hf_token":
            raise SecretFileError(
                f"secrets.{name}_file: {path} does not exist",
                "write it there (one line), or drop the setting to have one generated",
            )
        elif generate:
            found.files[name] = found.generated[name] = _generate(path)
        else:
            found.missing[name] = path
    for name, path in found.files.items():
        _usable(name, path)
    _distinct(found.files)
    if doorlocal.DOOR_KEYS in secret_names(cluster):
        doorlocal.made(config, cluster, found.files, found.missing, generate)
    return found


def named_files(config: Path, cluster: Cluster) -> set[Path]:
    """The secret files the config names itself (secrets.*_file), resolved."""
    return {path.resolve() for path in _given(config, cluster).values() if path}


def _given(config: Path, cluster: Cluster) -> dict[str, Path | None]:
    """Secret name -> the file the config names for it (relative to the config's folder, or
    absolute; `~` expanded), or None where it names none."""
    folder = config.resolve().parent
    s = cluster.secrets
    given = {"api_key": s.api_key_file, "hf_token": s.hf_token_file, "ray_token": s.ray_token_file}
    return {name: folder / Path(g).expanduser() if g else None for name, g in given.items()}


def newer(names: list[str], started: datetime, changed: dict[str, float], door: bool) -> list[str]:
    """Of a service's secrets, those changed on its node since it started (`changed`: name ->
    time of last change) that it reads at its start only (behind the front `door`, IN_PLACE
    ones are read when used)."""
    live = IN_PLACE if door else ()
    return [n for n in names if n not in live and started.timestamp() < changed.get(n, 0)]


def _default(config: Path, name: str) -> Path:
    return sidefiles.Beside(config).named(SECRET_NAMES[name])


def _generate(path: Path) -> Path:
    # O_EXCL: never overwrites; 0600 from the first byte.
    fd = os.open(sidefiles.ready(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(random_secrets.token_urlsafe(32))  # no newline: read as is
    return path


MAX_BYTES = 4096
SYSTEM = ("/proc", "/sys", "/dev")


def _usable(name: str, path: Path) -> None:
    """One rule for every secret file, checked before it is opened (a FIFO or a device is never
    read): a regular file outside /proc, /sys and /dev, of at most 4 KiB, readable by its owner
    alone, holding one line of printable ASCII with no surrounding whitespace (a final newline
    allowed). Its contents are never shown."""
    field = f"secrets.{name}_file: {path}"
    real = path.resolve()
    system = [top for top in SYSTEM if real == Path(top) or Path(top) in real.parents]
    if system:
        raise SecretFileError(f"{field} is under {system[0]}, not a file of yours",
                              "write the secret into a file of its own")  # fmt: skip
    info = path.stat()
    if not stat.S_ISREG(info.st_mode):
        raise SecretFileError(f"{field} is not a regular file", "write the secret into a file")
    if info.st_mode & 0o077:
        mode = info.st_mode & 0o777
        raise SecretFileError(f"{field} can be read by other users (mode {mode:o})",
                              f"chmod 600 {path}")  # fmt: skip
    if info.st_size > MAX_BYTES:
        raise SecretFileError(f"{field} holds {info.st_size} bytes, over {MAX_BYTES}",
                              "a secret is one line")  # fmt: skip
    line = path.read_bytes()
    line = line[:-1] if line.endswith(b"\n") else line
    if not line:
        what = (
            "serving would take requests from anyone" if name == "api_key" else "it holds nothing"
        )
        raise SecretFileError(f"{field} is empty: {what}", f"write it into {path}")
    if any(b < 0x20 or b > 0x7E for b in line) or line != line.strip():
        raise SecretFileError(
            f"{field} is not one line of printable ASCII (a second line, a CR, a NUL, a byte over"
            " 0x7e, or a space at either end)",
            "write the secret alone on one line",
        )


def _distinct(files: dict[str, Path]) -> None:
    """Each secret its own file: one file for both the API key and Ray's token would hand every
    API client the key to Ray's ports."""
    seen: dict[tuple[int, int], str] = {}
    for name, path in files.items():
        info = path.stat()
        other = seen.setdefault((info.st_dev, info.st_ino), name)
        if other != name:
            raise SecretFileError(f"secrets.{name}_file: {path} is also secrets.{other}_file",
                                  "give each secret a file of its own")  # fmt: skip


def unignored(paths: list[Path]) -> list[Path]:
    """Those of `paths` inside a git work tree that git does not ignore (could be committed)."""
    found = []
    for path in paths:
        inside = subprocess.run(
            ["git", "-C", str(path.parent), "rev-parse", "--is-inside-work-tree"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if inside.stdout.strip() != "true":
            continue
        ignored = subprocess.run(
            ["git", "-C", str(path.parent), "check-ignore", "-q", path.name], check=False
        )
        if ignored.returncode != 0:
            found.append(path)
    return found


def ignore(paths: list[Path]) -> Path | None:
    """Add each file's name to the .gitignore beside it (created if there is none)."""
    for path in paths:
        gitignore = path.parent / ".gitignore"
        old = gitignore.read_text(encoding="utf-8") if gitignore.exists() else ""
        lead = "" if not old or old.endswith("\n") else "\n"
        gitignore.write_text(f"{old}{lead}{path.name}\n", encoding="utf-8")
    return paths[0].parent / ".gitignore" if paths else None


def push(
    docker: DockerClient, node: str, cluster: str, image: str, files: dict[str, Path]
) -> dict[str, float]:
    """Write each secret onto the node at stack.secret_path (mode 0600, folder 0700): one
    short-lived container that mounts the node's folder reads the files as a tar archive on its
    standard input (like `docker cp`: never an argument), then moves them into place under their
    names; a file whose contents are already there is left as it was. One Docker call per node.
    Returns each secret's time of last change on the node (its mtime, node clock): a container
    started before it has the old one. The front door's routes and model list only seed the
    node: once there, they are nodes/door.py's (every cluster's on the node, not just ours)."""
    contents = {n: p.read_bytes() for n, p in files.items()}
    return write(docker, node, cluster, image, contents, keep=doorfiles.ROUTE_FILES)


def write(
    docker: DockerClient,
    node: str,
    cluster: str,
    image: str,
    files: dict[str, bytes],
    keep: tuple[str, ...] = (),
) -> dict[str, float]:
    """`push` of the files' contents (secret name -> bytes); those named in `keep` are left as
    they are when there."""
    if not files:
        return {}
    # A temporary name of its own per file: two writers of one folder (nodes sharing a
    # filesystem) never rename each other's file.
    partial = {name: f".{SECRET_NAMES[name]}.{random_secrets.token_hex(8)}" for name in files}
    script = "tar -x -C /s && chmod 700 /s"
    for name in files:
        new, old = f"/s/{partial[name]}", f"/s/{SECRET_NAMES[name]}"
        # Only the name and a time are printed, never the contents. Without cmp: changed.
        # IN_PLACE: the front door reads its keys again on a reload (nodes/door.py), bench
        # reads the API key when it runs.
        put = f"cat {new} > {old} && rm -f {new}" if name in IN_PLACE else f"mv {new} {old}"
        same = "true" if name in keep else f"cmp -s {new} {old}"
        script += f" && {{ if [ -e {old} ] && {same}; then rm -f {new};"
        script += f" else {put} && touch {old}; fi; }}"
        script += f' && echo "changed:{name}:$(stat -c %Y {old})"'
    archive = _archive({partial[name]: data for name, data in files.items()})
    folder = secrets_folder(cluster)
    writer = ["run", "--rm", "-i", "--pull", "never", "--network", "none", "--entrypoint", "sh"]
    try:
        said = run(
            [*docker.client_config.docker_cmd, *writer, "-v", f"{folder}:/s", image, "-c", script],
            input=archive,
        )
    except DockerException as e:
        raise DockerError.wrap(node, f"writing the {', '.join(files)} file failed", e) from None
    stamps = [line.split(":") for line in str(said).split() if line.startswith("changed:")]
    return {name: float(when) for _, name, when in stamps}


def _archive(files: dict[str, bytes]) -> bytes:
    """A tar archive of the files, each of mode 0600 and owned by root."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in files.items():
            entry = tarfile.TarInfo(name)
            entry.size, entry.mode, entry.mtime = len(data), 0o600, int(time.time())
            tar.addfile(entry, io.BytesIO(data))
    return out.getvalue()
