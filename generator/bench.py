"""`bench`: vLLM's own `vllm bench serve`, run inside the head's serve container against the
endpoint over a sweep of concurrencies (random prompts of a fixed length: nothing to download).
The API key is read from the container's secret file by the shell that runs the benchmark, never
put on a command line. Results are kept per lock: CONFIG-STEM.bench/<lock>/<UTC time>.json and a
plot (.png) of throughput against latency, one point per concurrency; `--compare` sets the latest
run against the latest one under the lock before."""

from __future__ import annotations

import hashlib
import json
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from python_on_whales import DockerException

from generator import lock, sidefiles
from generator.errors import PhaseError, VllmComposeError, reason
from generator.fleet import Fleet

API_KEY = "/run/secrets/api_key"  # as Compose mounts it in serve (stack.py)
RESULT = "/tmp/vllm-compose-bench.json"  # inside the serve container, read back at once
# vLLM's fields kept for each concurrency: its names, as its result JSON has them.
FIELDS = [
    "max_concurrency", "completed", "duration", "request_throughput", "output_throughput",
    "total_token_throughput", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms",
    "median_itl_ms", "p99_itl_ms", "median_e2el_ms", "p99_e2el_ms",
]  # fmt: skip


@dataclass(frozen=True)
class Sweep:
    concurrencies: list[int]
    prompts: int  # per concurrency
    input_len: int
    output_len: int


def command(fleet: Fleet, sweep: Sweep, concurrency: int) -> list[str]:
    """The shell line run in serve: the key read from its secret file into the benchmark's
    environment (vLLM sends OPENAI_API_KEY as the bearer token), then the result printed."""
    c = fleet.cluster
    bench = [
        "vllm", "bench", "serve", "--backend", "vllm",
        "--base-url", f"http://127.0.0.1:{c.vllm.port}", "--endpoint", "/v1/completions",
        "--model", c.served_model_name, "--tokenizer", c.model.path,
        "--dataset-name", "random", "--random-input-len", str(sweep.input_len),
        "--random-output-len", str(sweep.output_len), "--num-prompts", str(sweep.prompts),
        "--max-concurrency", str(concurrency), "--percentile-metrics", "ttft,tpot,itl,e2el",
        "--metric-percentiles", "50,99", "--disable-tqdm", "--save-result",
        "--result-dir", str(Path(RESULT).parent), "--result-filename", Path(RESULT).name,
    ]  # fmt: skip
    line = f'OPENAI_API_KEY="$(cat {API_KEY})" {shlex.join(bench)} >&2 && cat {RESULT}'
    return ["sh", "-c", line]


def run(fleet: Fleet, sweep: Sweep) -> list[dict[str, Any]]:
    """One result per concurrency, in the order given; says each as it comes."""
    found = []
    for concurrency in sweep.concurrencies:
        fleet.report(f"bench: concurrency {concurrency}: {sweep.prompts} requests ...")
        start = time.monotonic()
        try:
            said = fleet.execute(fleet.head, "serve", command(fleet, sweep, concurrency))
        except DockerException as e:
            said = f"vllm bench serve failed: {reason(e)}"
            raise PhaseError(fleet.head.name, "bench", said) from None
        result = json.loads(said)
        found.append({k: result.get(k) for k in FIELDS} | {"max_concurrency": concurrency})
        took = time.monotonic() - start
        fleet.report(f"bench: concurrency {concurrency}: done in {took:.0f} s")
    return found


def folder(config: Path, locked: lock.Lock | None) -> Path:
    """Where runs under this lock are kept (`unlocked` without one)."""
    key = hashlib.sha256(lock.text(locked).encode()).hexdigest()[:12] if locked else "unlocked"
    return config.with_name(f"{config.stem}.bench") / key


def save(
    config: Path, locked: lock.Lock | None, sweep: Sweep, results: list[dict[str, Any]]
) -> Path:
    """The run as JSON (and its plot beside it); returns the JSON's path."""
    where = folder(config, locked)
    sidefiles.folder(sidefiles.folder(where.parent) / where.name)
    path = where / f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    run_ = {
        "sweep": sweep.__dict__,
        "image": locked.image.id if locked else None,
        "results": results,
    }
    path.write_text(json.dumps(run_, indent=2) + "\n", encoding="utf-8")
    plot(results, path.with_suffix(".png"))
    return path


def plot(results: list[dict[str, Any]], path: Path) -> None:
    """Output tokens per second against median time per output token, a point per concurrency."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(figsize=(6, 4))
    xs = [r["median_tpot_ms"] or 0.0 for r in results]
    ys = [r["output_throughput"] or 0.0 for r in results]
    axes.plot(xs, ys, marker="o")
    for x, y, r in zip(xs, ys, results, strict=True):
        axes.annotate(
            f"c={r['max_concurrency']}", (x, y), textcoords="offset points", xytext=(4, 4)
        )
    axes.set_xlabel("median time per output token (ms)")
    axes.set_ylabel("output tokens per second")
    axes.set_title("vllm-compose bench")
    figure.tight_layout()
    figure.savefig(path)
    pyplot.close(figure)


def previous(config: Path, locked: lock.Lock | None) -> dict[str, Any]:
    """The latest run under another lock (the one before), for --compare."""
    here = folder(config, locked)
    others = (
        [p for p in here.parent.glob("*/*.json") if p.parent != here]
        if here.parent.is_dir()
        else []
    )
    if not others:
        raise VllmComposeError(
            f"{config}: no run under another lock to compare with",
            hint="run `vllm-compose bench` before the upgrade, then again after it",
        )
    found: dict[str, Any] = json.loads(max(others, key=lambda p: p.name).read_text())
    return found
