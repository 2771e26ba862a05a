#!/usr/bin/env python3
"""vllm-compose health checks, run inside the containers (standard library and Ray only).

  ray --address HOST:PORT --expect IP[,IP...] [--gpus N]
      healthy when every expected IP is an alive Ray node and the cluster has at least N GPUs
  serve --port P --model NAME
      healthy when a real completion (max_tokens 1) comes back: /health stays 200 with a dead engine
  nodes --address HOST:PORT
      prints the alive Ray nodes as JSON: {"IP": GPUs}
  slots --address HOST:PORT
      prints every alive Ray node's GPU slots as JSON: {"IP": {"gpus": total, "free": free now}}
  wait-for HOST:PORT --seconds S
      waits until a TCP connection to HOST:PORT succeeds
  facts --interface IF --ip IP --listen PORT --peers IP[,IP...] [--api-port P] [--model PATH]
      prints what preflight compares across nodes, as JSON: the interface and its addresses,
      TCP reach to every peer's IP (listening on IP:PORT meanwhile, until every peer got through),
      versions, the model's files, /dev/shm, memlock, Ray's memory monitor setting, RDMA devices
  manifest PATH
      prints the model's manifest as JSON: size and sha256 of every file (symlinks followed), and
      the revision when PATH is a Hugging Face cache snapshot
  send --root PATH --listen IP:PORT
      serves the files under PATH (symlinks followed) to `receive`, until stopped
  receive --root PATH --source IP:PORT [--manifest FILE]   (default: the manifest on stdin)
      makes PATH hold exactly the manifest's files: a file whose size and sha256 already match is
      kept; any other is fetched into a .partial file, checked, then renamed. Prints progress as
      JSON lines; exits non-zero unless every file matches
"""

import argparse
import fcntl
import hashlib
import json
import os
import platform
import resource
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
from importlib import metadata
import urllib.error
import urllib.request


def alive_nodes(address):
    """IP -> GPU count of every alive node, read straight from the GCS (no Ray driver)."""
    from ray._raylet import GcsClient  # noqa: PLC0415 - only this check needs Ray

    nodes = GcsClient(address=address).get_all_node_info(timeout=5).values()
    return {n.node_manager_address: n.resources_total.get("GPU", 0) for n in nodes if n.state == 0}


def gpu_slots(address):
    """IP -> {"gpus": total, "free": available} of every alive node, from the GCS (no driver)."""
    from ray._private.state import GlobalState  # noqa: PLC0415 - only this command needs Ray
    from ray._raylet import GcsClient, GcsClientOptions  # noqa: PLC0415

    nodes = GcsClient(address=address).get_all_node_info(timeout=5)
    state = GlobalState()
    options = GcsClientOptions.create(
        address, None, allow_cluster_id_nil=True, fetch_cluster_id_if_nil=False
    )
    state._initialize_global_state(options)
    free = state.available_resources_per_node()
    return {
        n.node_manager_address: {
            "gpus": n.resources_total.get("GPU", 0),
            "free": free.get(node_id.hex(), {}).get("GPU", 0),
        }
        for node_id, n in nodes.items()
        if n.state == 0
    }


def print_slots(args):
    try:
        print(json.dumps(gpu_slots(args.address), sort_keys=True))
    except Exception as e:  # noqa: BLE001
        return f"Ray GCS at {args.address} does not answer: {e}"
    return None


def check_ray(args):
    try:
        nodes = alive_nodes(args.address)
    except Exception as e:  # noqa: BLE001 - any failure to read the GCS is "not healthy yet"
        return f"Ray GCS at {args.address} does not answer: {e}"
    missing = [ip for ip in args.expect.split(",") if ip not in nodes]
    if missing:
        seen = ", ".join(sorted(nodes)) or "none"
        return f"Ray nodes missing: {', '.join(missing)} (alive: {seen})"
    gpus = sum(nodes.values())
    if gpus < args.gpus:
        return f"Ray cluster has {gpus:g} GPUs, {args.gpus} expected"
    return None


def print_nodes(args):
    try:
        print(json.dumps(alive_nodes(args.address), sort_keys=True))
    except Exception as e:  # noqa: BLE001
        return f"Ray GCS at {args.address} does not answer: {e}"
    return None


API_KEY = "/run/secrets/api_key"


def check_serve(args):
    body = json.dumps({"model": args.model, "prompt": "ping", "max_tokens": 1}).encode()
    headers = {"Content-Type": "application/json"}
    if os.path.exists(API_KEY):  # the serve container's secret; never on a command line
        with open(API_KEY) as f:
            headers["Authorization"] = f"Bearer {f.read().strip()}"
    url = f"http://127.0.0.1:{args.port}/v1/completions"
    request = urllib.request.Request(url, data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=args.timeout) as response:
            choices = json.load(response).get("choices")
    except (OSError, urllib.error.URLError, ValueError) as e:
        return f"completion at {url} failed: {e}"
    return None if choices else f"completion at {url} returned no choices"


def connect(host, port, seconds, every=1.0, timeout=30):
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


def wait_for(args):
    host, port = args.target.rsplit(":", 1)
    try:
        connect(host, port, args.seconds, timeout=2).close()
    except OSError as e:
        return f"{args.target} not reachable after {args.seconds:g} s: {e}"
    return None


def interface(name):
    """Whether the interface exists, is up, and its IPv4 addresses."""
    if name not in {n for _, n in socket.if_nameindex()}:
        return {"exists": False, "up": False, "addresses": []}
    try:
        with open(f"/sys/class/net/{name}/operstate") as f:
            state = f.read().strip()
    except OSError:
        state = "unknown"
    addresses = []
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


def reach(ip, port, peers, seconds):
    """Listen on ip:port and connect to every peer's ip:port, both until every pair got through or
    the time is up. -> ({peer: "ok" or the error}, [peers heard from]) or a listen error."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        server.bind((ip, port))
    except OSError as e:
        return {"listen": f"cannot listen on {ip}:{port}: {e}"}
    server.listen(16)
    server.settimeout(0.2)
    heard, outcome = set(), {}
    deadline = time.monotonic() + seconds

    def accept():
        while time.monotonic() < deadline and not heard.issuperset(peers):
            try:
                conn, (peer, _) = server.accept()
                heard.add(peer)
                conn.close()
            except OSError:
                pass

    listener = threading.Thread(target=accept, daemon=True)
    listener.start()
    for peer in peers:
        while True:
            try:
                socket.create_connection((peer, port), timeout=1, source_address=(ip, 0)).close()
                outcome[peer] = "ok"
                break
            except OSError as e:
                outcome[peer] = str(e)
                if time.monotonic() > deadline:
                    break
                time.sleep(0.2)
    listener.join()
    server.close()
    return {"to": outcome, "heard_from": sorted(heard)}


def model_files(path):
    """Relative path -> size of every file under path (symlinks followed), or None if absent."""
    if not os.path.isdir(path):
        return None
    files = {}
    for root, _, names in os.walk(path, followlinks=True):
        for name in names:
            full = os.path.join(root, name)
            try:
                files[os.path.relpath(full, path)] = os.stat(full).st_size
            except OSError:  # a dangling symlink
                files[os.path.relpath(full, path)] = -1
    return files


def version(dist):
    for name in (dist, f"{dist}-cpu"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def port_free(ip, port):
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


def rdma():
    """RDMA port states, e.g. {"mlx5_0/1": "ACTIVE"}; {} when the node has none."""
    states = {}
    base = "/sys/class/infiniband"
    for device in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        for port in sorted(os.listdir(f"{base}/{device}/ports")):
            with open(f"{base}/{device}/ports/{port}/state") as f:
                states[f"{device}/{port}"] = f.read().split(":")[-1].strip()
    return states


def gpus():
    if not shutil.which("nvidia-smi"):
        return None
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return len([line for line in out.stdout.splitlines() if line.startswith("GPU ")])


CHUNK = 1 << 20


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def manifest(args):
    root = args.path
    files = model_files(root)
    if files is None:
        return f"{root} does not exist"
    broken = [name for name, size in files.items() if size < 0]
    if broken:
        return f"{root}: dangling symlinks: {', '.join(sorted(broken)[:3])}"
    parent = os.path.dirname(os.path.normpath(root))
    revision = os.path.basename(os.path.normpath(root)) if parent.endswith("/snapshots") else None
    print(
        json.dumps(
            {
                "revision": revision,
                "files": {
                    name: {"size": files[name], "sha256": sha256_of(os.path.join(root, name))}
                    for name in sorted(files)
                },
            },
            sort_keys=True,
        )
    )
    return None


def inside(root, name):
    """root/name for a manifest's relative name; anything that could leave root is refused.
    Symlinks under root are followed when read (an HF cache's snapshot points into its blobs)."""
    if not name or os.path.isabs(name) or ".." in name.split("/"):
        raise ValueError(f"refusing path {name!r}")
    return os.path.join(root, name)


def send(args):
    """One request per line: {"file": NAME}; answered with 8 bytes of size, then the bytes."""
    host, port = args.listen.rsplit(":", 1)
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((host, int(port)))
    server.listen(64)
    print(f"vllm-compose-health: sending {args.root} on {args.listen}", flush=True)

    def serve(conn):
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


def recv_exact(conn, view):
    got = 0
    while got < len(view):
        n = conn.recv_into(view[got:])
        if not n:
            break
        got += n
    return got


def fetch(conn, size, out, digest):
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


def receive(args):
    if args.manifest:
        with open(args.manifest) as f:
            wanted = json.load(f)["files"]
    else:
        wanted = json.load(sys.stdin)["files"]
    host, port = args.source.rsplit(":", 1)
    os.makedirs(args.root, exist_ok=True)
    moved = kept = 0
    conn = None
    for name in sorted(wanted):
        want = wanted[name]
        path = inside(args.root, name)
        if os.path.isfile(path) and os.path.getsize(path) == want["size"]:
            if sha256_of(path) == want["sha256"]:
                kept += 1
                continue
        if conn is None:
            conn = connect(host, port, 30, every=0.2)  # the sender may still be starting
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
        moved += got
        if got != size:
            os.unlink(partial)
            return f"{name}: the source closed after {got} of {size} bytes"
        if digest.hexdigest() != want["sha256"]:
            os.unlink(partial)
            return f"{name}: sha256 differs from the manifest after the copy"
        os.replace(partial, path)
        print(json.dumps({"file": name, "bytes": size, "moved": moved}), flush=True)
    if conn is not None:
        conn.close()
    print(json.dumps({"done": True, "moved": moved, "kept": kept}), flush=True)
    return None


def facts(args):
    shm = os.statvfs("/dev/shm") if os.path.isdir("/dev/shm") else None
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
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
        "model": model_files(args.model) if args.model else None,
        "shm_bytes": shm.f_blocks * shm.f_frsize if shm else 0,
        "memlock": -1 if soft == resource.RLIM_INFINITY else soft,
        "memory_monitor": os.environ.get("RAY_memory_monitor_refresh_ms"),
        "api_port_free": port_free(args.ip, args.api_port) if args.api_port else None,
        "rdma": rdma(),
        "gpus": gpus(),
    }
    print(json.dumps(found, sort_keys=True))


def main():
    parser = argparse.ArgumentParser(prog="vllm-compose-health")
    sub = parser.add_subparsers(dest="check", required=True)
    ray = sub.add_parser("ray")
    ray.add_argument("--address", required=True)
    ray.add_argument("--expect", required=True)
    ray.add_argument("--gpus", type=float, default=0)
    serve = sub.add_parser("serve")
    serve.add_argument("--port", type=int, required=True)
    serve.add_argument("--model", required=True)
    serve.add_argument("--timeout", type=float, default=30)
    nodes = sub.add_parser("nodes")
    nodes.add_argument("--address", required=True)
    slots = sub.add_parser("slots")
    slots.add_argument("--address", required=True)
    wait = sub.add_parser("wait-for")
    wait.add_argument("target")
    wait.add_argument("--seconds", type=float, default=300)
    found = sub.add_parser("facts")
    found.add_argument("--interface", required=True)
    found.add_argument("--ip", required=True)
    found.add_argument("--listen", type=int, required=True)
    found.add_argument("--peers", default="")
    found.add_argument("--seconds", type=float, default=6)
    found.add_argument("--api-port", type=int)
    found.add_argument("--model")
    listing = sub.add_parser("manifest")
    listing.add_argument("path")
    sender = sub.add_parser("send")
    sender.add_argument("--root", required=True)
    sender.add_argument("--listen", required=True)
    receiver = sub.add_parser("receive")
    receiver.add_argument("--root", required=True)
    receiver.add_argument("--source", required=True)
    receiver.add_argument("--manifest", help="the manifest's file (default: stdin)")
    args = parser.parse_args()
    checks = {
        "ray": check_ray,
        "nodes": print_nodes,
        "slots": print_slots,
        "serve": check_serve,
        "wait-for": wait_for,
        "facts": facts,
        "manifest": manifest,
        "send": send,
        "receive": receive,
    }
    problem = checks[args.check](args)
    if problem:
        print(f"vllm-compose-health: {problem}", file=sys.stderr)
        sys.exit(1)
    if args.check not in ("nodes", "slots", "facts", "manifest", "send", "receive"):
        print(f"vllm-compose-health: {args.check} ok")


if __name__ == "__main__":
    main()
