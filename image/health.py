#!/usr/bin/env python3
"""vllm-compose health checks, run inside the containers (standard library and Ray only).

  ray --address HOST:PORT --expect IP[,IP...] [--gpus N]
      healthy when every expected IP is an alive Ray node and the cluster has at least N GPUs
  serve --port P --model NAME
      healthy when a real completion (max_tokens 1) comes back: /health stays 200 with a dead engine
  nodes --address HOST:PORT
      prints the alive Ray nodes as JSON: {"IP": GPUs}
  wait-for HOST:PORT --seconds S
      waits until a TCP connection to HOST:PORT succeeds
  facts --interface IF --ip IP --listen PORT --peers IP[,IP...] [--api-port P] [--model PATH]
      prints what preflight compares across nodes, as JSON: the interface and its addresses,
      TCP reach to every peer's IP (listening on IP:PORT meanwhile, until every peer got through),
      versions, the model's files, /dev/shm, memlock, Ray's memory monitor setting, RDMA devices
"""

import argparse
import fcntl
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


def check_serve(args):
    body = json.dumps({"model": args.model, "prompt": "ping", "max_tokens": 1}).encode()
    headers = {"Content-Type": "application/json"}
    url = f"http://127.0.0.1:{args.port}/v1/completions"
    request = urllib.request.Request(url, data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=args.timeout) as response:
            choices = json.load(response).get("choices")
    except (OSError, urllib.error.URLError, ValueError) as e:
        return f"completion at {url} failed: {e}"
    return None if choices else f"completion at {url} returned no choices"


def wait_for(args):
    host, port = args.target.rsplit(":", 1)
    deadline = time.monotonic() + args.seconds
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=2).close()
            return None
        except OSError as e:
            if time.monotonic() > deadline:
                return f"{args.target} not reachable after {args.seconds:g} s: {e}"
            time.sleep(1)


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


def facts(args):
    shm = os.statvfs("/dev/shm") if os.path.isdir("/dev/shm") else None
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    found = {
        "interface": interface(args.interface),
        "reach": reach(args.ip, args.listen, [p for p in args.peers.split(",") if p], args.seconds),
        "versions": {
            "python": platform.python_version(),
            **{name: version(name) for name in ("vllm", "ray", "torch")},
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
    args = parser.parse_args()
    checks = {
        "ray": check_ray,
        "nodes": print_nodes,
        "serve": check_serve,
        "wait-for": wait_for,
        "facts": facts,
    }
    problem = checks[args.check](args)
    if problem:
        print(f"vllm-compose-health: {problem}", file=sys.stderr)
        sys.exit(1)
    if args.check not in ("nodes", "facts"):
        print(f"vllm-compose-health: {args.check} ok")


if __name__ == "__main__":
    main()
