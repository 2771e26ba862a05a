"""Moving a model between nodes: its manifest (size and sha256 of every file), a sender that
serves the files, and a receiver that makes a folder hold exactly the manifest's files."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import struct
import sys
import threading
import time
from typing import Any, BinaryIO

from facts import model_files


def connect(
    host: str, port: int | str, seconds: float, every: float = 1.0, timeout: float = 30
) -> socket.socket:
    """A TCP connection to host:port, retried every `every` seconds until `seconds` have passed
    (the other end may still be starting); the last error is raised after that."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return socket.create_connection((host, int(port)), timeout=timeout)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(every)


CHUNK = 1 << 20


def _hashed(path: str) -> dict[str, Any]:
    """Size, sha256 and mtime (ns, read before hashing: a change during the hash shows later)."""
    seen = os.stat(path)
    return {"size": seen.st_size, "sha256": sha256_of(path), "mtime_ns": seen.st_mtime_ns}


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def manifest(args: argparse.Namespace) -> str | None:
    root = args.path
    files = model_files(root)
    if files is None:
        return f"{root} does not exist"
    broken = [name for name, size in files.items() if size < 0]
    if broken:
        first = sorted(broken)[0]
        target = os.readlink(os.path.join(root, first))
        return (
            f"{root}: {first} links to {target}, which the containers cannot see"
            f" ({len(broken)} such files); copy real files: cp -rL (or sync-model from a node"
            " that has them)"
        )
    parent = os.path.dirname(os.path.normpath(root))
    revision = os.path.basename(os.path.normpath(root)) if parent.endswith("/snapshots") else None
    print(
        json.dumps(
            {
                "revision": revision,
                "files": {name: _hashed(os.path.join(root, name)) for name in sorted(files)},
            },
            sort_keys=True,
        )
    )
    return None


def inside(root: str, name: str) -> str:
    """root/name for a manifest's relative name; anything that could leave root is refused.
    Symlinks under root are followed when read (an HF cache's snapshot points into its blobs)."""
    if not name or os.path.isabs(name) or ".." in name.split("/"):
        raise ValueError(f"refusing path {name!r}")
    return os.path.join(root, name)


def send(args: argparse.Namespace) -> str | None:
    """One request per line: {"file": NAME}; answered with 8 bytes of size, then the bytes."""
    host, port = args.listen.rsplit(":", 1)
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((host, int(port)))
    server.listen(64)
    print(f"vllm-compose-health: sending {args.root} on {args.listen}", flush=True)

    def serve(conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as requests:
            for line in requests:
                name = json.loads(line)["file"]
                with open(inside(args.root, name), "rb") as f:
                    size = os.fstat(f.fileno()).st_size
                    conn.sendall(struct.pack("!Q", size))
                    conn.sendfile(f)

    while True:
        conn, _ = server.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


def recv_exact(conn: socket.socket, view: memoryview) -> int:
    got = 0
    while got < len(view):
        n = conn.recv_into(view[got:])
        if not n:
            break
        got += n
    return got


def fetch(conn: socket.socket, size: int, out: BinaryIO, digest: Any) -> int:
    """size bytes from conn into out and digest; returns how many came."""
    view = memoryview(bytearray(CHUNK))
    got = 0
    while got < size:
        n = conn.recv_into(view[: min(CHUNK, size - got)])
        if not n:  # the source closed early
            break
        digest.update(view[:n])
        out.write(view[:n])
        got += n
    return got


def _wanted(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    if args.manifest:
        with open(args.manifest) as f:
            return dict(json.load(f)["files"])
    return dict(json.load(sys.stdin)["files"])


def _matches(path: str, want: dict[str, Any]) -> bool:
    return (
        os.path.isfile(path)
        and os.path.getsize(path) == want["size"]
        and sha256_of(path) == want["sha256"]
    )


def _copy(conn: socket.socket, name: str, want: dict[str, Any], path: str) -> int | str:
    """One file from the sender into `path` (through a .partial file, checked before it takes
    its place): the bytes moved, or why not."""
    conn.sendall(json.dumps({"file": name}).encode() + b"\n")
    header = bytearray(8)
    if recv_exact(conn, memoryview(header)) != 8:
        return f"{name}: the source closed the connection"
    size = struct.unpack("!Q", header)[0]
    if size != want["size"]:
        return f"{name}: the source has {size} bytes, the manifest says {want['size']}"
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    partial = path + ".partial"
    digest = hashlib.sha256()
    with open(partial, "wb") as out:
        got = fetch(conn, size, out, digest)
    if got != size:
        os.unlink(partial)
        return f"{name}: the source closed after {got} of {size} bytes"
    if digest.hexdigest() != want["sha256"]:
        os.unlink(partial)
        return f"{name}: sha256 differs from the manifest after the copy"
    os.replace(partial, path)
    return got


def receive(args: argparse.Namespace) -> str | None:
    wanted = _wanted(args)
    host, port = args.source.rsplit(":", 1)
    os.makedirs(args.root, exist_ok=True)
    moved = kept = 0
    conn = None
    for name in sorted(wanted):
        path = inside(args.root, name)
        if _matches(path, wanted[name]):
            kept += 1
            continue
        if conn is None:
            conn = connect(host, port, 30, every=0.2)  # the sender may still be starting
        got = _copy(conn, name, wanted[name], path)
        if isinstance(got, str):
            return got
        moved += got
        print(json.dumps({"file": name, "bytes": got, "moved": moved}), flush=True)
    if conn is not None:
        conn.close()
    print(json.dumps({"done": True, "moved": moved, "kept": kept}), flush=True)
    return None
