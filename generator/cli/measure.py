"""The commands that measure the endpoint: bench (its speed) and check (its answers)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.table import Table

from generator.base.errors import OptionError, VllmComposeError
from generator.cli.app import ConfigArg, JsonOpt, OutdirOpt, app, err, open_config, out
from generator.nodes import served
from generator.nodes.fleet import Fleet
from generator.operations import bench as benchmark
from generator.operations import benchruns, gate
from generator.operations.workflow import Opened

RecordOpt = Annotated[
    bool, typer.Option("--record", help="Record these answers as the golden ones.")
]

# (heading, field): narrow enough for 80 columns, each with its unit ("srv": as the server
# counted them); every field is in the saved JSON.
COLUMNS = [
    ("conc", "max_concurrency"), ("req/s", "request_throughput"),
    ("out\ntok/s", "output_throughput"), ("srv\ntok/s", "served_output_throughput"),
    ("TTFT p50\nms", "median_ttft_ms"), ("TTFT p99\nms", "p99_ttft_ms"),
    ("TPOT p50\nms", "median_tpot_ms"), ("TPOT p99\nms", "p99_tpot_ms"),
    ("failed\nrequests", "failed"),
]  # fmt: skip

INPUT = "Prompt tokens per request \\[default: 256, or half the model's context]."
PROMPTS = "Requests per concurrency."
PREFIX = "Prompts that share prefixes: the prefix cache's hit rate, from vLLM's counters."
REPEAT = "Runs per concurrency: the median and the spread."
OUTPUT = "Generated tokens per request \\[default: 128, or a quarter of the context]."
COMPARE = "Against the latest run under the lock before."
ConcurrencyOpt = Annotated[
    list[int] | None,
    typer.Option(min=1, max=4096, help="A concurrency to run; repeat it \\[default: 1 4 16]."),
]
DIRECT = "vLLM itself, past the front door (its cost: run once with, once without)."
REPLICA = "This replica's vLLM alone (1 on), past the door (with `replicas`)."


@app.command()
def bench(
    path: ConfigArg,
    outdir: OutdirOpt = None,
    concurrency: ConcurrencyOpt = None,
    prompts: Annotated[int, typer.Option(min=1, max=100_000, help=PROMPTS)] = 32,
    input_len: Annotated[int | None, typer.Option(min=1, max=10_000_000, help=INPUT)] = None,
    output_len: Annotated[int | None, typer.Option(min=1, max=10_000_000, help=OUTPUT)] = None,
    repeat: Annotated[int, typer.Option(min=1, max=20, help=REPEAT)] = 1,
    prefix: Annotated[bool, typer.Option("--prefix", help=PREFIX)] = False,
    compare: Annotated[bool, typer.Option("--compare", help=COMPARE)] = False,
    direct: Annotated[bool, typer.Option("--direct", help=DIRECT)] = False,
    replica: Annotated[int | None, typer.Option(min=1, max=16, help=REPLICA)] = None,
    as_json: JsonOpt = False,
) -> None:
    """vLLM's `vllm bench serve` from the serve image against the endpoint (through the front
    door, as clients reach it; `--direct`: vLLM itself; `--replica N`: that replica's alone),
    over a sweep of concurrencies: a table of TTFT and TPOT percentiles, throughput and failed
    requests; kept as JSON and a throughput-latency plot (PNG) per lock in the state folder.
    Exits 1 when any request failed (the run is kept, marked failed, never compared with)."""
    direct = direct or replica is not None
    benchruns.before_asking(path, compare, direct, prefix, input_len)
    opened = open_config(path, outdir)
    fleet = _measured(opened, replica)
    lengths = benchmark.fit(input_len, output_len, served.context(fleet, "bench"))
    sweep = benchmark.Sweep(concurrency or [1, 4, 16], prompts, *lengths, repeat, prefix, direct)
    err.print(f"bench: {sweep.input_len} prompt + {sweep.output_len} generated tokens per request")
    results = benchmark.run(fleet, sweep)
    saved = benchruns.save(path, opened.locked, sweep, results, _heading(opened, replica))
    _show(results, saved, as_json, prefix)
    failed = benchmark.failures(results)
    if failed:
        raise VllmComposeError(
            f"bench: requests failed ({'; '.join(failed)})",
            hint=f"the run is kept as failed ({saved.name}) and never compared with",
        )
    if compare:
        before = benchruns.previous(path, opened.locked, direct)
        for line in benchruns.changes(before["results"], results):
            err.print(line)


def _measured(opened: Opened, replica: int | None) -> Fleet:
    """The fleet whose head runs the benchmark: the door's, or the replica's asked for."""
    c = opened.cluster
    if replica is None:
        return opened.fleet
    if replica > c.replicas:
        raise OptionError(f"--replica {replica}: the config has {c.replicas} (replicas)",
                          f"--replica 1 to {c.replicas}, or leave it out for the door")  # fmt: skip
    return opened.groups[replica - 1].fleet


def _heading(opened: Opened, replica: int | None) -> str:
    c = opened.cluster
    heading = benchruns.title(c.name, c.served_model_name, opened.locked)
    return heading + (f" · replica {replica}" if replica else "")


def _show(results: list[dict[str, Any]], saved: Path, as_json: bool, prefix: bool) -> None:
    plotted = saved.with_suffix(".png")
    if as_json:
        drawn = str(plotted) if plotted.exists() else None
        out.print_json(data={"results": results, "saved": str(saved), "plot": drawn})
    else:
        out.print(_table(results))
        out.print(
            f"saved: {saved} (plot: {plotted.name})" if plotted.exists() else f"saved: {saved}"
        )
    if not plotted.exists():
        err.print("bench: no plot: matplotlib is missing (pip install 'vllm-compose[plot]')")
    for r in results:
        if prefix and r.get("prefix_cache_hit_rate") is not None:
            err.print(f"bench: concurrency {r['max_concurrency']}: the prefix cache answered"
                      f" {r['prefix_cache_hit_rate']:.0%} of prompt tokens")  # fmt: skip
        if r.get("spec_decode_acceptance_rate") is not None:
            err.print(f"bench: concurrency {r['max_concurrency']}: speculative decoding accepted"
                      f" {r['spec_decode_acceptance_rate']:.1f}% of draft tokens")  # fmt: skip


def _table(results: list[dict[str, Any]]) -> Table:
    table = Table(box=box.SIMPLE_HEAD, padding=0, show_edge=False)
    for name, _ in COLUMNS:
        table.add_column(name, justify="right", no_wrap=True)
    for r in results:
        table.add_row(*(_cell(r, key) for _, key in COLUMNS))
    return table


def _cell(r: dict[str, Any], key: str) -> str:
    value = r.get(key)
    if value is None:
        return "-"
    spread = r.get(f"{key}_spread")
    if spread and spread[1] > spread[0]:
        return f"{_figure(value)}±{_figure((spread[1] - spread[0]) / 2)}"
    return _figure(value)


def _figure(value: float) -> str:
    """Whole above 100, else three significant digits: 12346, 57.3, 0.812."""
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"


@app.command()
def check(
    path: ConfigArg,
    outdir: OutdirOpt = None,
    record: RecordOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """The correctness gate, run inside serve: greedy prompts twice give the same tokens, and
    the tokens recorded beside the config (the first check records them); a prompt of exactly
    the model's context answered and one token more refused; the tool-call and reasoning
    parsers, when the args name them. Exits 1 when a gate fails."""
    before = None if record else gate.recorded(path)  # refused before any engine is asked
    opened = open_config(path, outdir)
    opened.fleet.report("check: asking the served model")
    found = gate.ask(opened.fleet)
    verdicts = gate.judge(found, before)
    if before is None and verdicts[0].ok:  # only answers that repeat are worth keeping
        said = "replaced" if gate.path_for(path).exists() else "recorded"
        err.print(f"check: golden answers {said}: {gate.record(path, found, opened.locked)}")
    report = gate.report(verdicts)
    if as_json:
        out.print_json(data=report)
    else:
        for verdict in verdicts:
            out.print(verdict.line())
    if not report["ok"]:
        failed = [v.gate for v in verdicts if v.ok is False]
        raise VllmComposeError(f"check failed: {', '.join(failed)}")
