"""The command that measures the endpoint: bench."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from generator import bench as benchmark
from generator.cli.app import ConfigArg, JsonOpt, OutdirOpt, app, err, open_config, out

COLUMNS = [
    ("concurrency", "max_concurrency"), ("req/s", "request_throughput"),
    ("out tok/s", "output_throughput"), ("TTFT p50 ms", "median_ttft_ms"),
    ("TTFT p99 ms", "p99_ttft_ms"), ("TPOT p50 ms", "median_tpot_ms"),
    ("TPOT p99 ms", "p99_tpot_ms"), ("ITL p50 ms", "median_itl_ms"), ("ITL p99 ms", "p99_itl_ms"),
]  # fmt: skip


@app.command()
def bench(
    path: ConfigArg,
    outdir: OutdirOpt = None,
    concurrency: Annotated[
        list[int] | None,
        typer.Option(min=1, max=4096, help="A concurrency to run; repeat it \\[default: 1 4 16]."),
    ] = None,
    prompts: Annotated[
        int, typer.Option(min=1, max=100_000, help="Requests per concurrency.")
    ] = 32,
    input_len: Annotated[
        int, typer.Option(min=1, max=10_000_000, help="Prompt tokens per request.")
    ] = 256,
    output_len: Annotated[
        int, typer.Option(min=1, max=10_000_000, help="Generated tokens per request.")
    ] = 128,
    compare: Annotated[
        bool, typer.Option("--compare", help="Against the latest run under the lock before.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """vLLM's `vllm bench serve` from the serve image against the endpoint, over a sweep of
    concurrencies: a table of TTFT, TPOT and ITL percentiles and throughput; kept as JSON and a
    throughput-latency plot (PNG) per lock beside the config."""
    opened = open_config(path, outdir)
    sweep = benchmark.Sweep(concurrency or [1, 4, 16], prompts, input_len, output_len)
    results = benchmark.run(opened.fleet, sweep)
    saved = benchmark.save(path, opened.locked, sweep, results)
    if as_json:
        out.print_json(data={"results": results, "saved": str(saved)})
    else:
        out.print(_table(results))
        out.print(f"saved: {saved} (plot: {saved.with_suffix('.png').name})")
    if compare:
        before = benchmark.previous(path, opened.locked)
        for line in _changes(before["results"], results):
            err.print(line)


def _table(results: list[dict[str, Any]]) -> Table:
    table = Table(*(name for name, _ in COLUMNS))
    for r in results:
        table.add_row(*("-" if r[key] is None else f"{r[key]:.4g}" for _, key in COLUMNS))
    return table


def _changes(before: list[dict[str, Any]], now: list[dict[str, Any]]) -> list[str]:
    """Per concurrency run both times: output throughput and median TTFT, then and now."""
    then = {r["max_concurrency"]: r for r in before}
    lines = []
    for r in now:
        old = then.get(r["max_concurrency"])
        if old is None or not old["output_throughput"] or not old["median_ttft_ms"]:
            continue
        tput = 100 * (r["output_throughput"] / old["output_throughput"] - 1)
        ttft = 100 * (r["median_ttft_ms"] / old["median_ttft_ms"] - 1)
        lines.append(
            f"compare: concurrency {r['max_concurrency']}: output {old['output_throughput']:.4g}"
            f" -> {r['output_throughput']:.4g} tok/s ({tput:+.1f}%), TTFT p50"
            f" {old['median_ttft_ms']:.4g} -> {r['median_ttft_ms']:.4g} ms ({ttft:+.1f}%)"
        )
    return lines or ["compare: no concurrency was run both times"]
