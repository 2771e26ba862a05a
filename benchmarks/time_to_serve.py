"""Time to serve: `vllm-compose up` to the first completion, against the floor, the same image and
model started by hand with plain `docker run` on the same emulated nodes, in the same run.

    python -m benchmarks.time_to_serve [--runs N] [--backend native|ray]

Real vLLM (CPU build), tensor parallel 2 over two emulated nodes (tests/support/testbed.py). By
hand, the native backend is two `docker run`s (worker rank, then head); the Ray backend is vLLM's
run_cluster.sh way: a Ray head and a Ray worker container (`docker run ... ray start`), then `vllm
serve ... --distributed-executor-backend ray` run inside the head's container. Both ways run
alternately, so drift on this shared machine hits both alike; medians are compared.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from python_on_whales import DockerClient

from benchmarks.report import Figure, record
from tests.support import clusters, images
from tests.support.testbed import IFNAME, MODELS, Node, borrowed

MODEL = f"{MODELS}/{images.MODEL}"
PORT, MASTER_PORT = 30000, 29501
ARGS = ["--dtype", "float32", "--enforce-eager", "--max-model-len", "256"]
# On CPU, vLLM reads it as the share of host memory to reserve; with Ray, both nodes' ranks and
# the driver share this one machine.
RAY_UTILIZATION = "0.1"
WORK = Path("/tmp/vllm-compose-bench")
GOAL = 1.10  # `up` / by hand


def first_completion(ip: str, deadline: float, key: str | None = None) -> None:
    body = json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 1}).encode()
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    while time.monotonic() < deadline:
        request = urllib.request.Request(f"http://{ip}:{PORT}/v1/completions", body, headers)
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                if json.load(response)["choices"]:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"no completion from {ip} before the deadline")


def _env(node: Node) -> list[str]:
    env = [
        f"VLLM_HOST_IP={node.ip}",
        f"NCCL_SOCKET_IFNAME={IFNAME}",
        f"GLOO_SOCKET_IFNAME={IFNAME}",
    ]
    env += ["RAY_memory_monitor_refresh_ms=0", "RAY_USAGE_STATS_ENABLED=0"]
    return [arg for e in env for arg in ("-e", e)]


def _docker_run(node: Node, command: list[str]) -> None:
    cmd = ["docker", "--context", node.context, "run", "-d", "--name", "bench-hand"]
    cmd += ["--network", "host", "--ipc", "host", "-v", f"{MODEL}:{MODEL}:ro", *_env(node)]
    subprocess.run([*cmd, images.VLLM, *command], check=True, capture_output=True)


def by_hand_native(head: Node, worker: Node) -> None:
    """Two `docker run`s, as the project's TESTBED notes do it: worker rank first, then the head."""

    def run(node: Node, rank: int, extra: list[str]) -> None:
        cmd = ["vllm", "serve", MODEL, "--tensor-parallel-size", "2", *ARGS]
        cmd += ["--port", str(PORT), "--nnodes", "2", "--node-rank", str(rank)]
        cmd += ["--master-addr", str(head.ip), "--master-port", str(MASTER_PORT), *extra]
        _docker_run(node, cmd)

    run(worker, 1, ["--headless"])
    run(head, 0, [])


def by_hand_ray(head: Node, worker: Node) -> None:
    """vLLM's run_cluster.sh: a Ray head and a Ray worker container, then `vllm serve` inside the
    head's container."""
    ray = ["ray", "start", "--block", "--num-gpus", "1", "--disable-usage-stats"]
    _docker_run(head, [*ray, "--head", "--node-ip-address", str(head.ip), "--port", "6379"])
    _docker_run(worker, [*ray, "--address", f"{head.ip}:6379", "--node-ip-address", str(worker.ip)])
    serve = ["vllm", "serve", MODEL, "--tensor-parallel-size", "2", *ARGS, "--port", str(PORT)]
    serve += ["--distributed-executor-backend", "ray", "--gpu-memory-utilization", RAY_UTILIZATION]
    exec_ = ["docker", "--context", head.context, "exec", "-d", "bench-hand", *serve]
    subprocess.run(exec_, check=True, capture_output=True)


def by_hand(head: Node, worker: Node, backend: str) -> float:
    start = time.monotonic()
    (by_hand_ray if backend == "ray" else by_hand_native)(head, worker)
    first_completion(str(head.ip), start + 600)
    took = time.monotonic() - start
    for node in (head, worker):
        subprocess.run(
            ["docker", "--context", node.context, "rm", "-f", "bench-hand"],
            check=True,
            capture_output=True,
        )
    return took


def with_compose(config: Path, head: Node) -> tuple[float, str]:
    start = time.monotonic()
    up = subprocess.run(
        [sys.executable, "-m", "generator", "up", str(config)],
        capture_output=True,
        text=True,
        check=False,
    )
    if up.returncode != 0:
        raise RuntimeError(f"vllm-compose up failed:\n{up.stderr}")
    first_completion(str(head.ip), start + 600, clusters.api_key(config))
    took = time.monotonic() - start
    phases = re.search(r"^phases: (.*)$", up.stdout, re.M)
    subprocess.run(
        [sys.executable, "-m", "generator", "down", str(config)], check=True, capture_output=True
    )
    return took, phases.group(1) if phases else "?"


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.time_to_serve")
    parser.add_argument("--runs", type=int, default=2, help="runs of each way (default 2)")
    parser.add_argument("--backend", choices=["native", "ray"], default="native")
    args = parser.parse_args()
    runs, backend = args.runs, args.backend

    root = DockerClient()
    print("setup: image, model, testbed (not timed)", flush=True)
    image, model = images.vllm_base(root), images.tiny_model(root)
    with borrowed(2) as bed:
        head, worker = clusters.place_vllm(bed, image, model)
        WORK.mkdir(exist_ok=True)
        utilization = f" gpu_memory_utilization: {RAY_UTILIZATION}," if backend == "ray" else ""
        vllm = (
            f"{{port: {PORT}, master_port: {MASTER_PORT}, max_model_len: 256,{utilization}"
            " startup_timeout: 600, args: [--dtype, float32, --enforce-eager]}"
        )
        config = clusters.write_config(
            WORK / "bench.yaml", "bench", [head, worker], image, backend=backend,
            model=MODEL, vllm=vllm,
        )  # fmt: skip
        print("setup: the wrapper image on both nodes (not timed)", flush=True)
        with_compose(config, head)

        hand, compose, phases = [], [], []
        for i in range(runs):
            hand.append(by_hand(head, worker, backend))
            print(f"run {i + 1}: by hand    {hand[-1]:6.1f} s", flush=True)
            took, phase = with_compose(config, head)
            compose.append(took)
            phases.append(phase)
            print(f"run {i + 1}: vllm-compose {took:6.1f} s  ({phase})", flush=True)

    floor, ours = statistics.median(hand), statistics.median(compose)
    print()
    print(
        f"time to first completion: {backend} TP=2, 2 emulated nodes, tiny Llama, vLLM 0.32.0 CPU"
    )
    way = "ray start x2, vllm serve in the head's" if backend == "ray" else "docker run x2"
    print(f"  by hand ({way}): median {floor:6.1f} s   runs {_fmt(hand)}")
    print(f"  vllm-compose up:           median {ours:6.1f} s   runs {_fmt(compose)}")
    print(f"  ratio vllm-compose / by hand: {ours / floor:.2f}   (goal <= 1.10)")
    for i, phase in enumerate(phases):
        print(f"  phases, run {i + 1}: {phase}")
    title = "Time to serve (Ray)" if backend == "ray" else "Time to serve (native)"
    figures = [
        Figure(f"by hand (median of {runs})", f"{floor:.1f} s ({_fmt(hand)})"),
        Figure(f"`vllm-compose up` (median of {runs})", f"{ours:.1f} s ({_fmt(compose)})"),
        Figure("`up` / by hand", f"{ours / floor:.2f}", "<= 1.10", ours / floor <= GOAL),
        Figure("phases of `up`", phases[-1]),
    ]
    about = (
        f"Real vLLM 0.32.0 (CPU build), {backend} backend, TP=2 over two emulated nodes, the tiny"
        f" Llama: time to the first completion, `vllm-compose up` against by hand ({way})."
    )
    record(
        title, about, "`up` / by hand <= 1.10", figures, variant="ray" if backend == "ray" else ""
    )


def _fmt(values: list[float]) -> str:
    return ", ".join(f"{v:.1f}" for v in values)


if __name__ == "__main__":
    main()
