"""How to share requests between replicas, measured on real vLLM: the door's `leastconn`, its
`prefix` (a bounded consistent hash of the prompt's start) and vLLM's own router (`vllm-router`,
PyPI, its `cache_aware` policy), on a workload whose prompts share prefixes and one whose
prompts share none.

    python -m benchmarks.balance [--router PATH-TO-vllm-router]

Two replicas of the tiny model (CPU vLLM, TP=1 each, one per emulated node, one thread each)
brought up by `vllm-compose up` at its defaults but `front_door.balance`; `up` again for the
other policy. vllm-router runs in the first node (where the door runs), in front of the same two
vLLMs, asked by the clients directly (the door's keys aside: the same path's length). Per way
and workload: CLIENTS clients send REQUESTS streamed chat completions in all, each with a prompt
of about 200 tokens: PREFIXES starts of ~165 tokens shared in turn (the CPU build caches whole
blocks of 128 tokens), or each its own; new words each run, so no run meets another's cache.
Recorded: the prefix cache's hit rate over both replicas (vLLM's own counters, prompt tokens hit
/ asked), tokens/s and TTFT p50/p99.

Traffic goes only to the testbed's own addresses; every loop is bounded; the processes it starts
it ends by their IDs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import shutil
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from python_on_whales import DockerClient

from benchmarks.report import Figure, record
from tests.support import clusters, images
from tests.support.testbed import Node, running
from tests.test_e2e import MODEL, config
from tests.test_replicas import REPLICAS

CLIENTS, REQUESTS, PREFIXES = 4, 48, 4
WORDS = 38  # a shared start of ~165 tokens: past the CPU build's cache block of 128
ROUTER_PORT = 8801
DOOR = "http://192.168.200.12:30000"
ROUTER = f"http://192.168.200.12:{ROUTER_PORT}"
REPLICA_METRICS = ("http://127.0.0.1:8400/metrics", "http://192.168.200.13:30000/metrics")
WORK = Path("/tmp/vllm-compose-balance")


VOCABULARY = ("agent", "tool", "call", "result", "file", "search", "plan", "step", "reason",
              "answer", "context", "model", "node")  # fmt: skip


def prompts(shared: bool, rng: random.Random) -> list[tuple[str, str]]:
    """(its start, its own end) of each request: PREFIXES starts in turn, or each its own."""

    def text(n: int) -> str:
        return " ".join(rng.choice(VOCABULARY) for _ in range(n))

    heads = [text(WORDS) for _ in range(PREFIXES)]
    systems = [heads[i % PREFIXES] if shared else text(WORDS) for i in range(REQUESTS)]
    return [(system, f"Question {i}: {text(6)}?") for i, system in enumerate(systems)]


def ask(base: str, key: str, prompt: tuple[str, str]) -> tuple[float, int]:
    """One streamed chat completion: (seconds to its first token, tokens)."""
    shared, own = prompt
    messages = [{"role": "user", "content": f"{shared}\n{own}"}]
    body = {"model": MODEL, "stream": True, "max_tokens": 8, "messages": messages}
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    url = f"{base}/v1/chat/completions"
    request = urllib.request.Request(url, json.dumps(body).encode(), headers)
    sent, first, tokens = time.monotonic(), 0.0, 0
    try:
        response = urllib.request.urlopen(request, timeout=120)
    except urllib.error.HTTPError as e:
        raise SystemExit(f"balance: {base} answered {e.code}: {e.read()[:300]!r}") from None
    with response:
        for raw in response:
            if raw.startswith(b"data: {") and b'"content"' in raw:
                first = first or time.monotonic() - sent
                tokens += 1
    return first, tokens


def counters(head: Node) -> tuple[float, float]:
    """(prompt tokens hit, asked) in both replicas' prefix caches, as vLLM counts them."""
    hits = queries = 0.0
    for url in REPLICA_METRICS:
        text = head.nsexec("curl", "-sf", "-m", "10", url).stdout
        for line in text.splitlines():
            if line.startswith("vllm:prefix_cache_hits_total"):
                hits += float(line.rsplit(" ", 1)[1])
            elif line.startswith("vllm:prefix_cache_queries_total"):
                queries += float(line.rsplit(" ", 1)[1])
    return hits, queries


def measured(base: str, key: str, head: Node, shared: bool, rng: random.Random) -> dict[str, float]:
    before = counters(head)
    began = time.monotonic()
    with ThreadPoolExecutor(CLIENTS) as pool:
        answers = list(pool.map(lambda p: ask(base, key, p), prompts(shared, rng)))
    took = time.monotonic() - began
    hits, queries = (after - was for after, was in zip(counters(head), before, strict=True))
    ttft = sorted(first * 1000 for first, _ in answers)
    p99 = ttft[min(len(ttft) - 1, int(0.99 * len(ttft)))]
    tps = sum(t for _, t in answers) / took
    return {"hit": hits / queries if queries else 0.0, "tps": tps,
            "p50": statistics.median(ttft), "p99": p99}  # fmt: skip


@contextlib.contextmanager
def router(head: Node, binary: str, key: str) -> Iterator[None]:
    """vllm-router in the first node, in front of both replicas; ended by its ID."""
    workers = ["http://127.0.0.1:8400", "http://192.168.200.13:30000"]
    command = ["ip", "netns", "exec", head.netns, binary, "--host", "192.168.200.12", "--port",
               str(ROUTER_PORT), "--worker-urls", *workers, "--policy", "cache_aware",
               "--api-key", key]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while head.nsexec("curl", "-sf", "-m", "2", f"{ROUTER}/health", check=False).returncode:
            if time.monotonic() > deadline or process.poll() is not None:
                raise SystemExit("balance: vllm-router did not answer within 120 s")
            time.sleep(1)
        yield
    finally:
        process.terminate()
        process.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.balance", description=__doc__)
    parser.add_argument("--router", default=shutil.which("vllm-router") or "",
                        help="vllm-router's binary (pip install vllm-router)")  # fmt: skip
    binary = parser.parse_args().router or sys.exit("balance: no vllm-router (pip install it)")
    found: dict[tuple[str, bool], dict[str, float]] = {}
    rng = random.Random(7)
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    with running(2) as bed:
        root = DockerClient()
        clusters.place_vllm(bed, images.vllm_base(root), images.tiny_model(root))
        head = bed.nodes[0]
        for way in ("leastconn", "prefix", "vllm-router"):
            balance = "prefix" if way == "prefix" else "leastconn"
            path = config(
                WORK, bed, "balance", "native", extra=REPLICAS, door=f"balance: {balance}"
            )
            up = clusters.cli("up", path, cwd=WORK)
            if up.returncode:
                raise SystemExit(f"balance: up failed: {up.stderr[-2000:]}")
            key = clusters.api_key(path)
            base = ROUTER if way == "vllm-router" else DOOR
            with router(head, binary, key) if way == "vllm-router" else contextlib.nullcontext():
                for shared in (True, False):
                    found[way, shared] = measured(base, key, head, shared, rng)
                    print(way, "shared" if shared else "distinct", found[way, shared], flush=True)
        clusters.cli("down", WORK / "balance.yaml", cwd=WORK)
    figures = [
        Figure(f"{way}, {'shared prefixes' if shared else 'no shared prefix'}",
               f"hit {f['hit']:.0%}, {f['tps']:.1f} tokens/s, TTFT p50 {f['p50']:.0f} ms,"
               f" p99 {f['p99']:.0f} ms")
        for (way, shared), f in found.items()
    ]  # fmt: skip
    about = (f"Two replicas of the tiny model (CPU vLLM, one thread each) behind the door with"
             f" leastconn, with prefix, and behind vllm-router (cache_aware); {CLIENTS} clients,"
             f" {REQUESTS} streamed requests a workload of prompts of ~200 tokens,"
             f" {PREFIXES} shared prefixes or none.")  # fmt: skip
    record("Balancing replicas", about, "none: it picks the default", figures)


if __name__ == "__main__":
    main()
