"""`bench`: vLLM's own `vllm bench serve`, run inside the head's serve container against the
endpoint (through the front door, as clients reach it, unless `direct`) over a sweep of
concurrencies (random prompts of a fixed length: nothing to download). The API key is read from
the container's secret file by the shell that runs the benchmark, never put on a command line.
The sweep's lengths fit the served model's context, or are refused before anything runs. Each
point can be repeated; the figures kept are the median and the spread. Failed requests are
counted per point, and the tokens the server itself counted (vLLM's own counter, which a client
that counts stream chunks under-counts with speculative decoding) are set beside the client's.
Saving, plotting and comparing runs: benchruns.py."""

from __future__ import annotations

import json
import shlex
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from python_on_whales import DockerException

from generator.base import probes
from generator.base.errors import OptionError, PhaseError, last_line, reason
from generator.config import ports
from generator.nodes import served
from generator.nodes.fleet import Fleet

API_KEY = "/run/secrets/api_key"  # as Compose mounts it in serve (stack.py)
RESULT = "/tmp/vllm-compose-bench.json"  # inside the serve container, read back at once
INPUT_LEN, OUTPUT_LEN = 256, 128  # the defaults, when the model's context holds them
# vLLM's fields kept for each concurrency: its names, as its result JSON has them.
FIELDS = [
    "max_concurrency", "completed", "failed", "duration", "request_throughput",
    "output_throughput", "total_token_throughput", "median_ttft_ms", "p99_ttft_ms",
    "median_tpot_ms", "p99_tpot_ms", "median_itl_ms", "p99_itl_ms", "median_e2el_ms",
    "p99_e2el_ms", "spec_decode_acceptance_rate", "spec_decode_acceptance_length",
]  # fmt: skip
SPREAD = ["output_throughput", "median_ttft_ms"]  # kept as [lowest, highest] over the repeats


@dataclass(frozen=True)
class Sweep:
    concurrencies: list[int]
    prompts: int  # per concurrency
    input_len: int
    output_len: int
    repeat: int = 1
    prefix: bool = False  # prompts that share prefixes: the prefix cache's probe
    direct: bool = False  # vLLM itself, past the front door


def fit(input_len: int | None, output_len: int | None, limit: int | None) -> tuple[int, int]:
    """The sweep's prompt and output lengths. Unset ones take the defaults, cut to fit a smaller
    context (half of it prompt, a quarter generated); a sweep that cannot fit is refused."""
    if limit is None:
        return input_len or INPUT_LEN, output_len or OUTPUT_LEN
    found = (input_len or min(INPUT_LEN, limit // 2), output_len or min(OUTPUT_LEN, limit // 4))
    if found[0] + found[1] > limit or found[1] < 1:
        given = [f"--{n}-len {v}" for n, v in (("input", input_len), ("output", output_len)) if v]
        raise OptionError(
            f"{' and '.join(given) or 'the sweep'}: {found[0]} prompt + {found[1]} generated tokens"
            f" do not fit the model's context of {limit} tokens (max_model_len)",
            hint=f"ask for at most {limit} tokens in all, or raise vllm.max_model_len",
        )
    return found


def command(fleet: Fleet, sweep: Sweep, concurrency: int) -> list[str]:
    """The shell line run in serve: the key read from its secret file into the benchmark's
    environment (vLLM sends OPENAI_API_KEY as the bearer token), then the result printed."""
    c = fleet.cluster
    port = ports.vllm(c) if sweep.direct else c.vllm.port  # the same without a front door
    bench = [
        "vllm", "bench", "serve", "--backend", "vllm",
        "--base-url", f"http://127.0.0.1:{port}", "--endpoint", "/v1/completions",
        "--model", c.served_model_name, "--tokenizer", c.model.path,
        *dataset(sweep), "--num-prompts", str(sweep.prompts),
        "--max-concurrency", str(concurrency), "--percentile-metrics", "ttft,tpot,itl,e2el",
        "--metric-percentiles", "50,99", "--disable-tqdm", "--save-result", "--save-detailed",
        "--result-dir", str(Path(RESULT).parent), "--result-filename", Path(RESULT).name,
    ]  # fmt: skip
    line = f'OPENAI_API_KEY="$(cat {API_KEY})" {shlex.join(bench)} >&2 && cat {RESULT}'
    return ["sh", "-c", line]


def dataset(sweep: Sweep) -> list[str]:
    """Random prompts of a fixed length; with `prefix`, each three quarters a prefix that a
    quarter of the prompts share (vLLM's prefix_repetition), the rest random."""
    if not sweep.prefix:
        return ["--dataset-name", "random", "--random-input-len", str(sweep.input_len),
                "--random-output-len", str(sweep.output_len)]  # fmt: skip
    shared = sweep.input_len * 3 // 4
    return ["--dataset-name", "prefix_repetition", "--prefix-repetition-prefix-len", str(shared),
            "--prefix-repetition-suffix-len", str(sweep.input_len - shared),
            "--prefix-repetition-num-prefixes", str(max(1, sweep.prompts // 4)),
            "--prefix-repetition-output-len", str(sweep.output_len)]  # fmt: skip


def run(fleet: Fleet, sweep: Sweep) -> list[dict[str, Any]]:
    """One result per concurrency, in the order given; says each as it comes."""
    found = []
    for concurrency in sweep.concurrencies:
        runs = []
        for n in range(1, sweep.repeat + 1):
            of = f" (run {n} of {sweep.repeat})" if sweep.repeat > 1 else ""
            fleet.report(f"bench: concurrency {concurrency}{of}: {sweep.prompts} requests ...")
            start = time.monotonic()
            runs.append(once(fleet, sweep, concurrency))
            took = time.monotonic() - start
            fleet.report(f"bench: concurrency {concurrency}{of}: done in {took:.0f} s")
        found.append(summary(runs) | {"max_concurrency": concurrency})
    return found


def once(fleet: Fleet, sweep: Sweep, concurrency: int) -> dict[str, Any]:
    """One run of vLLM's benchmark: its fields, its first error, and the server's token count."""
    before = served.load(fleet)
    try:
        said = fleet.execute(fleet.head, "serve", command(fleet, sweep, concurrency))
    except DockerException as e:
        said = f"vllm bench serve failed: {reason(e)}"
        raise PhaseError(fleet.head.name, "bench", said) from None
    result = json.loads(said)
    kept = {k: result.get(k) for k in FIELDS}
    # vLLM's client keeps an HTTP error's reason alone ("Not Found"): the server's own message
    # is asked for with one request of ours, when it fails too.
    said_by_client = next((last_line(e) for e in result.get("errors") or [] if e), None)
    kept["first_error"] = (_server_said(fleet) if kept.get("failed") else None) or said_by_client
    after = served.load(fleet)
    if before and after and result.get("duration"):
        kept["served_output_throughput"] = (after["tokens"] - before["tokens"]) / result["duration"]
        queries = after.get("prefix_queries", 0) - before.get("prefix_queries", 0)
        hits = after.get("prefix_hits", 0) - before.get("prefix_hits", 0)
        kept["prefix_cache_hit_rate"] = hits / queries if queries > 0 else None
    return kept


def _server_said(fleet: Fleet) -> str | None:
    """Why the server fails a plain completion of the served model, or None when it answers."""
    c = fleet.cluster
    try:
        fleet.execute(fleet.head, "serve", probes.serve(ports.vllm(c), c.served_model_name))
    except DockerException as e:
        return reason(e).removeprefix("vllm-compose-health: ")
    return None


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """A point's runs as one: the median of each figure, failures summed, the first error, and
    the spread ([lowest, highest]) of throughput and TTFT."""
    found: dict[str, Any] = {"repeats": len(runs)}
    for key in [*FIELDS, "served_output_throughput", "prefix_cache_hit_rate"]:
        values = [r[key] for r in runs if r.get(key) is not None]
        found[key] = statistics.median(values) if values else None
    found["failed"] = sum(r.get("failed") or 0 for r in runs)
    found["completed"] = sum(r.get("completed") or 0 for r in runs)
    found["first_error"] = next((r["first_error"] for r in runs if r.get("first_error")), None)
    for key in SPREAD:
        values = [r[key] for r in runs if r.get(key) is not None]
        found[f"{key}_spread"] = [min(values), max(values)] if values else None
    return found


def failures(results: list[dict[str, Any]]) -> list[str]:
    """One line per point with failed requests, with the server's first error."""
    return [
        f"concurrency {r['max_concurrency']}: {r['failed']} of {r['failed'] + r['completed']}"
        f" requests failed; first error: {r['first_error'] or 'none given'}"
        for r in results
        if r.get("failed")
    ]
