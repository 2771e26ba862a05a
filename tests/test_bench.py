"""bench's logic alone: the lengths that fit, the command it runs in serve, how repeats and
failures are summed, what it keeps, the comparison and its noise, the table's width. The fleet
here is a fake that answers as `vllm bench serve` and vLLM's /metrics do; the real benchmark
against the served tiny model is in test_e2e.py."""

from __future__ import annotations

import dataclasses
import io
import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from matplotlib import image
from python_on_whales import DockerException
from rich.console import Console

from generator.base.errors import OptionError, VllmComposeError
from generator.cli import measure
from generator.config import ports
from generator.operations import bench, benchruns
from tests.test_preflight import SAMPLE

SWEEP = bench.Sweep([1, 4], prompts=8, input_len=32, output_len=16)


def result(concurrency: int, throughput: float, ttft: float, **more: Any) -> dict[str, Any]:
    found: dict[str, Any] = dict.fromkeys(bench.FIELDS, 1.0)
    return found | {"max_concurrency": concurrency, "output_throughput": throughput,
                    "median_ttft_ms": ttft, "median_tpot_ms": 1000 / throughput,
                    "failed": 0, "first_error": None} | more  # fmt: skip


class FakeFleet:
    """Answers the benchmark with the given vLLM results in turn, and /metrics with a token
    counter that grows by `served` tokens per run."""

    def __init__(
        self, answers: list[dict[str, Any]], served: float = 0, refused: str | None = None
    ) -> None:
        self.cluster, self.head = SAMPLE, types.SimpleNamespace(name="spark1")
        self.answers, self.served, self.refused = answers, served, refused
        self.counters = {"tokens": 0.0, "running": 0, "prefix_queries": 0.0, "prefix_hits": 0.0}
        self.said: list[str] = []
        self.commands: list[str] = []

    def execute(self, node: object, service: str, args: list[str]) -> str:
        if args[0] == "sh":
            self.commands.append(args[2])
            self.counters["tokens"] += self.served
            self.counters["prefix_queries"] += 1000
            self.counters["prefix_hits"] += 600
            return json.dumps(self.answers.pop(0))
        if args[1] == "serve":  # the one completion asked when requests failed
            if self.refused:
                said = f"vllm-compose-health: {self.refused}\n"
                raise DockerException(["docker", "exec"], 1, stderr=said.encode())
            return "vllm-compose-health: serve ok"
        return json.dumps(self.counters)

    def report(self, line: str) -> None:
        self.said.append(line)


def vllm_result(throughput: float, failed: int = 0, error: str = "") -> dict[str, Any]:
    """The fields of vLLM's result JSON that bench reads (names as vllm/benchmarks/serve.py)."""
    return {"completed": 8 - failed, "failed": failed, "duration": 2.0,
            "output_throughput": throughput, "median_ttft_ms": 40.0, "median_tpot_ms": 9.0,
            "errors": [""] * (8 - failed) + [error] * failed}  # fmt: skip


def test_the_key_is_read_from_the_secret_file_inside_never_on_a_command_line() -> None:
    fleet = types.SimpleNamespace(cluster=SAMPLE)
    argv = bench.command(fleet, SWEEP, 4)  # type: ignore[arg-type]
    assert argv[:2] == ["sh", "-c"]
    assert argv[2].startswith('OPENAI_API_KEY="$(cat /run/secrets/api_key)" vllm bench serve ')
    assert "--max-concurrency 4 " in argv[2] and "--num-prompts 8 " in argv[2]
    assert f"--tokenizer {SAMPLE.model.path} " in argv[2]


def test_bench_goes_through_the_front_door_unless_direct() -> None:
    fleet = types.SimpleNamespace(cluster=SAMPLE)
    door = bench.command(fleet, SWEEP, 1)[2]  # type: ignore[arg-type]
    direct = bench.command(fleet, dataclasses.replace(SWEEP, direct=True), 1)[2]  # type: ignore[arg-type]
    assert f"--base-url http://127.0.0.1:{SAMPLE.vllm.port} " in door
    assert f"--base-url http://127.0.0.1:{ports.vllm(SAMPLE)} " in direct
    assert ports.vllm(SAMPLE) != SAMPLE.vllm.port


def test_the_default_lengths_fit_the_models_context_and_a_sweep_that_cannot_is_refused() -> None:
    assert bench.fit(None, None, None) == (256, 128)
    assert bench.fit(None, None, 4096) == (256, 128)
    assert bench.fit(None, None, 256) == (128, 64)  # the demo's max_model_len
    assert bench.fit(192, None, 256) == (192, 64)
    with pytest.raises(OptionError, match=r"--input-len 200: 200 prompt \+ 64 generated tokens"
                       r" do not fit the model's context of 256 tokens"):  # fmt: skip
        bench.fit(200, None, 256)
    with pytest.raises(OptionError, match=r"^--input-len 256 and --output-len 128: .* of 256"):
        bench.fit(256, 128, 256)
    assert bench.fit(None, 16, 256) == (128, 16)
    with pytest.raises(OptionError, match=r"^the sweep: 1 prompt"):
        bench.fit(None, None, 3)  # a context too small for any default
    assert OptionError.exit_code == 2


def test_repeats_are_summed_as_the_median_with_their_spread_and_tokens_counted_by_the_server() -> (
    None
):
    answers = [vllm_result(t) for t in (100.0, 120.0, 110.0, 300.0, 310.0, 290.0)]
    fleet = FakeFleet(answers, served=440.0)  # 220 tokens/s over the 2 s each run took
    found = bench.run(fleet, bench.Sweep([1, 4], 8, 32, 16, repeat=3))  # type: ignore[arg-type]
    assert [r["output_throughput"] for r in found] == [110.0, 300.0]
    assert [r["output_throughput_spread"] for r in found] == [[100.0, 120.0], [290.0, 310.0]]
    assert [r["completed"] for r in found] == [24, 24] and found[0]["repeats"] == 3
    assert found[0]["served_output_throughput"] == 220.0
    assert fleet.said[0] == "bench: concurrency 1 (run 1 of 3): 8 requests ..."
    assert bench.failures(found) == []


def test_failed_requests_are_counted_with_the_servers_first_error_and_never_a_baseline(
    tmp_path: Path,
) -> None:
    error = "Bad Request: This model's maximum context length is 256 tokens"
    fleet = FakeFleet([vllm_result(0.0, failed=8, error=error)])
    found = bench.run(fleet, bench.Sweep([2], 8, 32, 16))  # type: ignore[arg-type]
    assert bench.failures(found) == [f"concurrency 2: 8 of 8 requests failed; first error: {error}"]
    # vLLM's client keeps a traceback's last line; the server's own message comes first when a
    # completion of ours fails too.
    traceback = "Traceback (most recent call last):\n  ...\nTimeoutError: timed out\n"
    timed_out = FakeFleet([vllm_result(0.0, failed=8, error=traceback)])
    assert bench.run(timed_out, bench.Sweep([1], 8, 32, 16))[0]["first_error"] == (  # type: ignore[arg-type]
        "TimeoutError: timed out"
    )
    server = "completion at http://127.0.0.1:8000/v1/completions failed: HTTP 404: no such model"
    refused = FakeFleet([vllm_result(0.0, failed=8, error="Not Found")], refused=server)
    assert bench.run(refused, bench.Sweep([1], 8, 32, 16))[0]["first_error"] == server  # type: ignore[arg-type]
    config = tmp_path / "c.yaml"
    saved = benchruns.save(config, None, SWEEP, found)
    assert json.loads(saved.read_text())["failed"] == 8
    saved.parent.rename(saved.parent.with_name("0123456789ab"))  # as under the lock before
    with pytest.raises(VllmComposeError, match="no run without failed requests"):
        benchruns.previous(config, None)


def test_a_run_is_kept_per_lock_with_a_plot_and_compared_with_the_lock_before(
    tmp_path: Path,
) -> None:
    config = tmp_path / "c.yaml"
    with pytest.raises(VllmComposeError, match="no run without failed requests"):
        benchruns.previous(config, None)
    title = benchruns.title("demo", "tiny", None)
    assert title.startswith("demo · tiny\nlock unlocked · 20")
    first = benchruns.save(config, None, SWEEP, [result(1, 50.0, 40.0), result(4, 150.0, 60.0)])
    assert first.parent.name == "unlocked"
    assert json.loads(first.read_text())["results"][1]["output_throughput"] == 150.0
    height, width, _ = image.imread(first.with_suffix(".png")).shape
    assert (width, height) == (600, 400)
    moved = first.parent.with_name("0123456789ab")  # as a run under another lock would be
    first.parent.rename(moved)
    with pytest.raises(VllmComposeError, match="no run without failed requests"):
        benchruns.previous(config, None, direct=True)  # that run went through the front door
    before = benchruns.previous(config, None)
    now = [result(1, 55.0, 30.0), result(16, 300.0, 90.0)]
    assert benchruns.changes(before["results"], now) == [
        "compare: concurrency 1: output 50 -> 55 tok/s (+10.0%), TTFT p50 40 -> 30 ms (-25.0%)",
        "compare: one run per point: its noise is unknown (--repeat 3 measures it)",
    ]


def test_a_delta_inside_the_noise_of_the_repeats_is_not_called_a_change() -> None:
    def point(tput: float, low: float, high: float) -> dict[str, Any]:
        return result(1, tput, 40.0, repeats=3, output_throughput_spread=[low, high],
                      median_ttft_ms_spread=[38.0, 42.0])  # fmt: skip

    noisy = benchruns.changes([point(100.0, 90.0, 110.0)], [point(105.0, 95.0, 115.0)])
    assert noisy == ["compare: concurrency 1: output 100 -> 105 tok/s (within the noise),"
                     " TTFT p50 40 -> 40 ms (within the noise)"]  # fmt: skip
    real = benchruns.changes([point(100.0, 98.0, 102.0)], [point(130.0, 128.0, 132.0)])
    assert real[0].startswith("compare: concurrency 1: output 100 -> 130 tok/s (+30.0%)")


def test_the_table_fits_80_columns_with_every_figure_whole() -> None:
    rows = [result(c, 12345.678, 98765.4, served_output_throughput=12001.5, failed=1000,
                   p99_ttft_ms=123456.7, output_throughput_spread=[12000.1, 12800.9],
                   max_concurrency=c) for c in (1, 16, 4096)]  # fmt: skip
    console = Console(file=io.StringIO(), width=80, color_system=None)
    console.print(measure._table(rows))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    print(text)
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "…" not in text and "conc" in text and "4096" in text and "12346±400" in text
    assert text.count(" ms") == 4 and "tok/s" in text  # every column says its unit


def test_the_prefix_probe_shares_prefixes_and_reads_the_hit_rate_from_the_servers_counters() -> (
    None
):
    fleet = FakeFleet([vllm_result(100.0)])
    sweep = bench.Sweep([4], 16, 128, 32, prefix=True)
    found = bench.run(fleet, sweep)  # type: ignore[arg-type]
    line = fleet.commands[0]
    assert "--dataset-name prefix_repetition --prefix-repetition-prefix-len 96" in line
    assert "--prefix-repetition-suffix-len 32 --prefix-repetition-num-prefixes 4" in line
    assert "--prefix-repetition-output-len 32" in line and "--random-input-len" not in line
    assert found[0]["prefix_cache_hit_rate"] == 0.6


def test_without_matplotlib_the_run_is_kept_unplotted_and_bench_says_how_to_get_the_plot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as an install without the extra
    results = [result(1, 50.0, 40.0)]
    saved = benchruns.save(tmp_path / "c.yaml", None, SWEEP, results)
    assert saved.exists() and not saved.with_suffix(".png").exists()
    measure._show(results, saved, as_json=True, prefix=False)
    said = capsys.readouterr()
    assert json.loads(said.out)["plot"] is None
    assert "bench: no plot: matplotlib is missing (pip install 'vllm-compose[plot]')" in said.err
