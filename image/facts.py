"""What preflight compares across nodes, as a node's container sees it: the interface and its
addresses, TCP reach to every peer, versions, the model's files, /dev/shm, memlock, Ray's memory
monitor setting, RDMA ports, the GPUs and the node's memory (image/gpus.py). The JSON
generator/operations/checks.py reads as `Facts`."""

from __future__ import annotations

import argparse
import errno
import fcntl
import importlib.util
import json
import os
import platform
import resource
import shutil
import socket
import struct
import subprocess
import threading
import time
from importlib import metadata
from typing import Any

import gpus

ABSENT = "absent"  # what a node that does not carry its ip tells its peers


def interface(name: str) -> dict[str, Any]:
    """Whether the interface exists, is up, and its IPv4 addresses."""
    if name not in {n for _, n in socket.if_nameindex()}:
        return {"exists": False, "up": False, "addresses": []}
    try:
        with open(f"/sys/class/net/{name}/operstate") as f:
            state = f.read().strip()
    except OSError:
        state = "unknown"
    addresses: list[str] = []
    if shutil.which("ip"):
        out = subprocess.run(["ip", "-4", "-o", "addr", "show", "dev", name], capture_output=True)
        addresses = [w.split("/")[0] for w in out.stdout.decode().split() if "/" in w and "." in w]
    else:  # the primary address only
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            packed = fcntl.ioctl(probe.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
            addresses = [socket.inet_ntoa(packed[20:24])]
        except OSError:
            pass
        finally:
            probe.close()
    # "unknown" is what virtual and some RDMA links report while carrying traffic.
    return {"exists": True, "up": state in ("up", "unknown"), "addresses": addresses}


def reach(ip: str, port: int, peers: list[str], seconds: float) -> dict[str, Any]:
    """Listen on ip:port and connect to every peer's ip:port, both until every pair got through or
    the time is up. -> ({peer: "ok" or the error}, [peers heard from]) or a listen error. A node
    that does not carry its ip tells every peer so (from any address it has): they stop waiting
    for that ip at once instead of taking its refusals for a node that listens late."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        server.bind((ip, port))
    except OSError as e:
        if e.errno == errno.EADDRNOTAVAIL:
            _each(_announce, [(ip, (p, port), time.monotonic() + seconds) for p in peers])
        busy = e.errno == errno.EADDRINUSE  # something else holds the port: another may do
        return {"listen": f"cannot listen on {ip}:{port}: {e}", "busy": busy}
    server.listen(16)
    server.settimeout(0.2)
    heard: set[str] = set()
    given_up: set[str] = set()
    outcome: dict[str, str] = {}
    absent: dict[str, str] = {}
    deadline = time.monotonic() + seconds

    # Every peer at once: one that cannot be reached does not hold up the others.
    accepting = threading.Thread(
        target=_accept, args=(server, peers, heard, given_up, deadline, absent)
    )
    accepting.start()
    _each(_connect, [(ip, (p, port), deadline, outcome, given_up) for p in peers])
    accepting.join()
    server.close()
    return {"to": outcome | absent, "heard_from": sorted(heard)}


def _each(target: Any, calls: list[tuple[Any, ...]]) -> None:
    threads = [threading.Thread(target=target, args=a) for a in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _announce(ip: str, peer: tuple[str, int], deadline: float) -> None:
    """Tell the peer that `ip` is not on this node, once it listens (or the deadline)."""
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(peer, timeout=1) as conn:
                conn.sendall(f"{ABSENT} {ip}\n".encode())
            return
        except ConnectionRefusedError:
            time.sleep(0.1)
        except OSError:
            return


def _accept(
    server: socket.socket,
    peers: list[str],
    heard: set[str],
    given_up: set[str],
    deadline: float,
    absent: dict[str, str],
) -> None:
    """Until every peer got through to us, or our own try of it failed for good (then the pair
    already has its cause, and the peer cannot get through either), or its node said it does not
    carry that ip."""
    while time.monotonic() < deadline and not heard.union(given_up).issuperset(peers):
        try:
            conn, (peer, _) = server.accept()
            with conn:
                conn.settimeout(0.5)
                said = conn.recv(64).decode(errors="replace").split()
        except OSError:
            continue
        if len(said) == 2 and said[0] == ABSENT and said[1] in peers:
            absent[said[1]] = f"its node does not carry that address (said from {peer})"
            given_up.add(said[1])
        else:
            heard.add(peer)


def _connect(
    ip: str, peer: tuple[str, int], deadline: float, outcome: dict[str, str], given_up: set[str]
) -> None:
    """Connect from `ip` to the peer until it answers or the deadline; outcome[peer IP] says.
    Refused: the peer is there but not listening yet, so try again. Anything else (no route, no
    ARP answer, a second 1 s timeout) will not mend in seconds: give up at once."""
    timeouts = 0
    while peer[0] not in given_up:
        try:
            socket.create_connection(peer, timeout=1, source_address=(ip, 0)).close()
            outcome[peer[0]] = "ok"
            return
        except OSError as e:
            outcome[peer[0]] = str(e)
            timeouts += isinstance(e, TimeoutError)
            final = not isinstance(e, (ConnectionRefusedError, TimeoutError)) or timeouts > 1
            if final or time.monotonic() > deadline:
                given_up.add(peer[0])
                return
            time.sleep(0.1)


def model_walk(path: str) -> tuple[dict[str, int], dict[str, int], dict[str, str]] | None:
    """One walk of the model folder (symlinks followed), None if absent: relative path -> size
    (-1 for a symlink this container cannot follow), relative path -> mtime in ns (what `verify`
    stamps, operations/stamps.py), and each unfollowable symlink -> its target (outside the
    mounted folder, or gone)."""
    if not os.path.isdir(path):
        return None
    sizes: dict[str, int] = {}
    mtimes: dict[str, int] = {}
    links: dict[str, str] = {}
    for root, _, names in os.walk(path, followlinks=True):
        for name in names:
            full = os.path.join(root, name)
            relative = os.path.relpath(full, path)
            try:
                seen = os.stat(full)
            except OSError:
                sizes[relative] = -1
                if os.path.islink(full):
                    links[relative] = os.readlink(full)
                continue
            sizes[relative], mtimes[relative] = seen.st_size, seen.st_mtime_ns
    return sizes, mtimes, links


def model_files(path: str) -> dict[str, int] | None:
    """Relative path -> size of every file under path (symlinks followed), or None if absent."""
    walked = model_walk(path)
    return walked[0] if walked else None


def version(dist: str) -> str | None:
    for name in (dist, f"{dist}-cpu"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def port_free(ip: str, port: int) -> bool:
    """Whether a server could listen there. SO_REUSEADDR, as servers set it: connections of a
    stopped server lingering in TIME_WAIT do not count as taken."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        probe.bind((ip, port))
        return True
    except OSError:
        return False
    finally:
        probe.close()


def rdma() -> dict[str, str]:
    """RDMA port states, e.g. {"mlx5_0/1": "ACTIVE"}; {} when the node has none."""
    states: dict[str, str] = {}
    base = "/sys/class/infiniband"
    for device in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        for port in sorted(os.listdir(f"{base}/{device}/ports")):
            with open(f"{base}/{device}/ports/{port}/state") as f:
                states[f"{device}/{port}"] = f.read().split(":")[-1].strip()
    return states


def facts(args: argparse.Namespace) -> None:
    shm = os.statvfs("/dev/shm") if os.path.isdir("/dev/shm") else None
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    model = model_walk(args.model) if args.model else None
    found = {
        "interface": interface(args.interface),
        "reach": reach(args.ip, args.listen, [p for p in args.peers.split(",") if p], args.seconds),
        "versions": {
            "python": platform.python_version(),
            **{name: version(name) for name in ("vllm", "ray", "torch")},
            "nccl": next(
                (v for v in map(version, ("nvidia-nccl-cu13", "nvidia-nccl-cu12")) if v), None
            ),
        },
        "ray_on_path": shutil.which("ray") is not None,
        # Ray's client extra (grpcio): `ray start --head --ray-client-server-port` needs it, and
        # the minimal Ray (`pip install ray`) lacks it.
        "ray_client": importlib.util.find_spec("grpc") is not None,
        "model": model[0] if model else None,
        "unreachable_links": model[2] if model else {},
        "model_mtimes": model[1] if model else {},
        "shm_bytes": shm.f_blocks * shm.f_frsize if shm else 0,
        "memlock": -1 if soft == resource.RLIM_INFINITY else soft,
        # Ray's own spelling of the variable.
        "memory_monitor": os.environ.get("RAY_memory_monitor_refresh_ms"),  # noqa: SIM112
        "api_port_free": port_free(args.ip, args.api_port) if args.api_port else None,
        "rdma": rdma(),
    }
    hardware = gpus.report()  # the GPUs (temperature, power, clock reasons) and the node's memory
    found |= hardware | {"gpus": None if hardware["devices"] is None else len(hardware["devices"])}
    print(json.dumps(found, sort_keys=True))
