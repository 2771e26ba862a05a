"""The front door's cost and its keys' timing, side by side in one run: real vLLM (CPU build, the
tiny model, eager), TP=2 over two emulated nodes, the tool at its defaults (front door on).

    python -m benchmarks.door [--rounds N]

- Cost: `vllm-compose bench` as the README runs it (through the front door, as clients reach
  it) and `vllm-compose bench --direct` (vLLM itself) in turn, N rounds, the order alternated,
  after one untimed `bench --direct` (vLLM's first batches of a size are slower);
  per concurrency the median over the rounds of output tokens/s through the door over direct,
  and of the median TTFT's difference. Goals: >= 0.98x, <= 2 ms more. Beside them, where the
  cost goes: the CPU seconds the door's container and both serve containers used during each
  `bench` (their cgroups' own counts), on this machine where the model runs on the same CPUs.
- Keys: `keys add` then requests with the new key until one is answered (every 0.1 s), and
  `keys revoke` then requests until one is refused: seconds from the command's start. Goal:
  <= 5 s each.

Traffic goes only to the testbed's own addresses; every loop is bounded.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from python_on_whales import DockerClient

from benchmarks.common import serving, tool
from benchmarks.report import Figure, record
from tests.support import clusters, images
from tests.support.testbed import MODELS, Node, borrowed

MODEL = f"{MODELS}/{images.MODEL}"
PORT = 30000
WORK = Path("/tmp/vllm-compose-door")
KEY_LIMIT = 30  # seconds a key change may take before the run gives up on it
PROJECT = "door"  # the cluster's name


@dataclass(frozen=True)
class Run:
    figures: dict[int, dict[str, float]]  # concurrency -> bench's figures
    cpu: dict[str, float]  # "door", "vllm" -> CPU seconds used during the run


def bench(config: Path, direct: bool) -> dict[int, dict[str, float]]:
    """One `bench` at its defaults: concurrency -> its figures."""
    said = json.loads(tool("bench", config, "--json", *(["--direct"] if direct else [])))
    return {r["max_concurrency"]: r for r in said["results"]}


def cpu(node: Node, service: str) -> float:
    """CPU seconds the service's container has used so far: its cgroup's own count (cgroup v1's
    cpuacct, or v2's cpu.stat), every process it ran included, exited ones too."""
    pid = clusters.containers(node, PROJECT)[service].state.pid
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpuacct" in controllers.split(","):
            usage = Path(f"/sys/fs/cgroup/{controllers}{path}/cpuacct.usage").read_text()
            return int(usage) / 1e9
    stat = Path(f"/sys/fs/cgroup{path}/cpu.stat").read_text().split()  # v2: the `0::` line
    return int(stat[stat.index("usage_usec") + 1]) / 1e6


def measured(config: Path, direct: bool, head: Node, worker: Node) -> Run:
    """One `bench`, with the CPU seconds the door and vLLM (both nodes' serve) used meanwhile."""
    parts = {"door": [(head, "front-door")], "vllm": [(head, "serve"), (worker, "serve")]}
    before = {name: sum(cpu(*one) for one in where) for name, where in parts.items()}
    figures = bench(config, direct)
    used = {name: sum(cpu(*one) for one in where) - before[name] for name, where in parts.items()}
    return Run(figures, used)


def status(ip: str, key: str) -> int:
    """The HTTP status of one short completion with `key` (0: no answer)."""
    body = json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 1}).encode()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    request = urllib.request.Request(f"http://{ip}:{PORT}/v1/completions", body, headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def until(ip: str, key: str, wanted: int, start: float) -> float:
    """Seconds from `start` until a request with `key` gets `wanted`."""
    while status(ip, key) != wanted:
        if time.monotonic() - start > KEY_LIMIT:
            raise RuntimeError(f"no {wanted} in {KEY_LIMIT} s")
        time.sleep(0.1)
    return time.monotonic() - start


def keys(config: Path, ip: str) -> tuple[float, float]:
    """(seconds until a new key is answered, until it is refused once revoked)."""
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "generator", "keys", "add", str(config), "bench"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    added = until(ip, done.stdout.strip(), 200, start)
    start = time.monotonic()
    tool("keys", "revoke", config, "bench")
    return added, until(ip, done.stdout.strip(), 401, start)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.door")
    parser.add_argument("--rounds", type=int, default=3, choices=range(1, 11))
    rounds = parser.parse_args().rounds
    root = DockerClient()
    print("setup: images, model, testbed (not timed)", flush=True)
    image, model = images.vllm_base(root), images.tiny_model(root)
    with borrowed(2) as bed:
        head, worker = clusters.place_vllm(bed, image, model)
        shutil.rmtree(WORK, ignore_errors=True)
        WORK.mkdir()
        # Eager: this CPU image cannot compile; the door's cost does not depend on it.
        args = "args: [--dtype, float32, --enforce-eager]"
        vllm = f"{{port: {PORT}, max_model_len: 256, startup_timeout: 900, {args}}}"
        config = clusters.write_config(WORK / "door.yaml", PROJECT, [head, worker], image,
                                       backend="native", model=MODEL, vllm=vllm)  # fmt: skip
        tool("up", config)
        serving(str(head.ip), clusters.api_key(config))
        # Untimed: vLLM's first batches of each size are slower, and would count against
        # whichever path ran first (round 1's door, before this).
        print("warm-up: bench --direct (not counted)", flush=True)
        bench(config, direct=True)
        runs: dict[bool, list[Run]] = {False: [], True: []}
        try:
            for n in range(rounds):
                for direct in (n % 2 == 1, n % 2 == 0):
                    how = "--direct" if direct else "(front door)"
                    print(f"round {n + 1}: bench {how}", flush=True)
                    runs[direct].append(measured(config, direct, head, worker))
        except RuntimeError:
            kept(head)
            raise
        timings = [keys(config, str(head.ip)) for _ in range(3)]
        tool("down", config)
    _report(runs, timings)


def kept(head: Node) -> None:
    """The head's containers' logs, kept in WORK for a failed run (the testbed goes with it)."""
    for container in head.docker.container.list(all=True):
        log = WORK / f"{container.name}.log"
        log.write_text(str(head.docker.container.logs(container, timestamps=True)))
        print(f"kept: {log}", flush=True)


def _report(runs: dict[bool, list[Run]], timings: list[tuple[float, float]]) -> None:
    door, direct = [r.figures for r in runs[False]], [r.figures for r in runs[True]]
    print("\nfront door against direct (median over the rounds):")
    pairs = list(zip(door, direct, strict=True))
    figures = []
    for c in sorted(door[0]):
        rate = "output_throughput"
        ratio = statistics.median(d[c][rate] / x[c][rate] for d, x in pairs)
        ttft = statistics.median(d[c]["median_ttft_ms"] - x[c]["median_ttft_ms"] for d, x in pairs)
        each = ", ".join(
            f"{d[c]['output_throughput']:.0f}/{x[c]['output_throughput']:.0f}" for d, x in pairs
        )
        print(f"  concurrency {c:>3}: output tok/s {ratio:.3f}x direct (goal >= 0.98; door/direct"
              f" by round: {each}), median TTFT {ttft:+.1f} ms (goal <= +2)")  # fmt: skip
        figures += [
            Figure(f"output tok/s, door / direct, at {c}", f"{ratio:.3f}x ({each})", ">= 0.98x",
                   ratio >= 0.98),
            Figure(f"median TTFT, door minus direct, at {c}", f"{ttft:+.1f} ms", "<= +2 ms",
                   ttft <= 2),
        ]  # fmt: skip
    figures.append(Figure("the door's CPU a `bench`", _cpu(runs)))
    for added, revoked in timings:
        print(f"  keys: a new key answered {added:.2f} s after `keys add` began, refused"
              f" {revoked:.2f} s after `keys revoke` began (goal <= 5 s)")  # fmt: skip
    adds, revokes = [t[0] for t in timings], [t[1] for t in timings]
    figures += [
        Figure("`keys add`, then a client let in", f"{min(adds):.2f} to {max(adds):.2f} s",
               "<= 5 s", max(adds) <= 5),
        Figure("`keys revoke`, then a client refused",
               f"{min(revokes):.2f} to {max(revokes):.2f} s", "<= 5 s", max(revokes) <= 5),
    ]  # fmt: skip
    about = ("Real vLLM (CPU build, the tiny Llama, eager), TP=2 over two emulated nodes, the tool"
             " at its defaults. `vllm-compose bench` through the door against `bench --direct`, in"
             f" turn, {len(pairs)} rounds after an untimed one; then a key added and revoked,"
             " timed to a client's first answer or refusal.")  # fmt: skip
    goal = "tokens/s >= 0.98x direct, median TTFT <= +2 ms; a key change seen in <= 5 s"
    record("The front door's cost and key changes", about, goal, figures)


def _cpu(runs: dict[bool, list[Run]]) -> str:
    """Where the door's cost goes: the CPU it used, against serve's (vLLM on both nodes, and
    bench's client, which runs in the head's serve), per `bench` (median over the rounds)."""

    def median(direct: bool, part: str) -> float:
        return statistics.median(r.cpu[part] for r in runs[direct])

    tokens = statistics.median(
        sum(f["output_throughput"] * f["duration"] for f in r.figures.values()) for r in runs[False]
    )
    door, serve, serve_direct = median(False, "door"), median(False, "vllm"), median(True, "vllm")
    print(f"  CPU a bench: the door {door:.2f} s through it ({median(True, 'door'):.2f} s when"
          f" direct), {door / tokens * 1e6:.0f} us a generated token; serve {serve:.1f} s through"
          f" the door, {serve_direct:.1f} s direct; the door's share of the two:"
          f" {door / (door + serve):.1%}")  # fmt: skip
    return (f"{door:.2f} s, {door / tokens * 1e6:.0f} µs a generated token,"
            f" {door / (door + serve):.1%} of the door's and serve's")  # fmt: skip


if __name__ == "__main__":
    main()
