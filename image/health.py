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
"""

import argparse
import json
import socket
import sys
import time
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
    args = parser.parse_args()
    checks = {"ray": check_ray, "nodes": print_nodes, "serve": check_serve, "wait-for": wait_for}
    problem = checks[args.check](args)
    if problem:
        print(f"vllm-compose-health: {problem}", file=sys.stderr)
        sys.exit(1)
    if args.check != "nodes":
        print(f"vllm-compose-health: {args.check} ok")


if __name__ == "__main__":
    main()
