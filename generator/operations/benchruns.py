"""`bench`'s runs kept in the config's state folder: CONFIG-STEM.state/bench/<lock>/<UTC
time>.json and a plot (.png) of throughput against latency, one point per concurrency. A run
with failed requests is kept and marked so, and never taken as the run to compare with.
`--compare` sets a run against the latest clean one under the lock before; a change is named only
when it is outside the noise (the spread of the repeats of both runs)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from generator.base import sidefiles
from generator.base.errors import OptionError, VllmComposeError
from generator.operations import lock
from generator.operations.bench import Sweep


def folder(config: Path, locked: lock.Lock | None) -> Path:
    """Where runs under this lock are kept (`unlocked` without one)."""
    return sidefiles.Beside(config).bench / lock.key(locked)


def save(
    config: Path,
    locked: lock.Lock | None,
    sweep: Sweep,
    results: list[dict[str, Any]],
    title: str = "vllm-compose bench",
) -> Path:
    """The run as JSON (and its plot beside it); returns the JSON's path."""
    where = folder(config, locked)
    sidefiles.folder(sidefiles.folder(where.parent) / where.name)
    path = where / f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    run_ = {
        "sweep": sweep.__dict__,
        "image": locked.image.id if locked else None,
        "failed": sum(r.get("failed") or 0 for r in results),
        "results": results,
    }
    path.write_text(json.dumps(run_, indent=2) + "\n", encoding="utf-8")
    plot(results, path.with_suffix(".png"), title)
    return path


def title(cluster: str, model: str, locked: lock.Lock | None) -> str:
    """The plot's title: cluster, model, lock and date."""
    day = time.strftime("%Y-%m-%d", time.gmtime())
    return f"{cluster} · {model}\nlock {lock.key(locked)} · {day}"


def plot(results: list[dict[str, Any]], path: Path, heading: str) -> None:
    """Output tokens per second against median time per output token, a point per concurrency;
    none without matplotlib (an extra: `vllm-compose[plot]`)."""
    try:
        import matplotlib
    except ImportError:
        return

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
    axes.set_title(heading, fontsize=9)
    figure.tight_layout()
    figure.savefig(path)
    pyplot.close(figure)


def before_asking(
    config: Path, compare: bool, direct: bool, prefix: bool, input_len: int | None
) -> None:
    """What `bench` can refuse before it asks an engine anything (exit 2): its runs' folder a
    link, `--compare` with no run to compare with, `--prefix` with prompts too short to share."""
    sidefiles.not_a_link(sidefiles.not_a_link(sidefiles.Beside(config).state) / "bench")
    if prefix and input_len is not None and input_len * 3 // 4 < 1:
        raise OptionError(f"--prefix --input-len {input_len}: prompts that short share no prefix",
                          "--input-len 4 or more (three quarters of it are shared)")  # fmt: skip
    if compare:
        previous(config, lock.read(config), direct)


def previous(config: Path, locked: lock.Lock | None, direct: bool = False) -> dict[str, Any]:
    """The latest run with no failed request under another lock (the one before), measured the
    same way (`direct`: past the front door)."""
    here = folder(config, locked)
    others = [p for p in here.parent.glob("*/*.json") if p.parent != here]
    for path in sorted(others, key=lambda p: p.name, reverse=True):
        found = None if sidefiles.problem(path) else _clean(path)
        if found is not None and found["sweep"].get("direct", False) == direct:
            return found
    raise OptionError(
        f"bench --compare: {config}: no run without failed requests under another lock to"
        " compare with",
        hint="run `vllm-compose bench` before the upgrade, then again after it",
    )


def _clean(path: Path) -> dict[str, Any] | None:
    """The run kept at `path`, or None when it failed a request or is not a run of ours (a link,
    too large, not JSON, not of its shape): never a baseline."""
    try:
        run_ = sidefiles.read_json(path)
        results = run_["results"]
        failed = run_.get("failed") or any(r.get("failed") for r in results)
        valid = isinstance(run_["sweep"], dict) and all(
            isinstance(r["max_concurrency"], int) for r in results)  # fmt: skip
    except (OSError, VllmComposeError, KeyError, TypeError, AttributeError):
        return None
    return None if failed or not valid else dict(run_)


def changes(before: list[dict[str, Any]], now: list[dict[str, Any]]) -> list[str]:
    """Per concurrency run both times: output throughput and median TTFT, then and now, each
    named a change only when the two runs' spreads do not overlap."""
    then = {r["max_concurrency"]: r for r in before}
    lines = []
    for r in now:
        old = then.get(r["max_concurrency"])
        if old is None or not old["output_throughput"] or not old["median_ttft_ms"]:
            continue
        parts = [
            _delta("output", old, r, "output_throughput", "tok/s"),
            _delta("TTFT p50", old, r, "median_ttft_ms", "ms"),
        ]
        lines.append(f"compare: concurrency {r['max_concurrency']}: {', '.join(parts)}")
    if lines and any(r.get("repeats", 1) < 2 for r in [*before, *now]):
        lines.append("compare: one run per point: its noise is unknown (--repeat 3 measures it)")
    return lines or ["compare: no concurrency was run both times"]


def _delta(name: str, old: dict[str, Any], new: dict[str, Any], field: str, unit: str) -> str:
    a, b = old[field], new[field]
    low_a, high_a = old.get(f"{field}_spread") or [a, a]
    low_b, high_b = new.get(f"{field}_spread") or [b, b]
    noise = low_b <= high_a and low_a <= high_b and (high_a > low_a or high_b > low_b)
    verdict = "within the noise" if noise else f"{100 * (b / a - 1):+.1f}%"
    return f"{name} {a:.4g} -> {b:.4g} {unit} ({verdict})"
