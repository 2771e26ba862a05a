"""bench's logic alone: the command it runs in serve, what it keeps, the comparison (the real
`vllm bench serve` against the served tiny model is in test_e2e.py)."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
from matplotlib import image

from generator import bench
from generator.cli import measure
from generator.errors import VllmComposeError
from tests.test_preflight import SAMPLE

SWEEP = bench.Sweep([1, 4], prompts=8, input_len=32, output_len=16)


def result(concurrency: int, throughput: float, ttft: float) -> dict[str, float | None]:
    found: dict[str, float | None] = dict.fromkeys(bench.FIELDS, 1.0)
    return found | {"max_concurrency": concurrency, "output_throughput": throughput,
                    "median_ttft_ms": ttft, "median_tpot_ms": 1000 / throughput}  # fmt: skip


def test_the_key_is_read_from_the_secret_file_inside_never_on_a_command_line() -> None:
    fleet = types.SimpleNamespace(cluster=SAMPLE)
    argv = bench.command(fleet, SWEEP, 4)  # type: ignore[arg-type]
    assert argv[:2] == ["sh", "-c"]
    assert argv[2].startswith('OPENAI_API_KEY="$(cat /run/secrets/api_key)" vllm bench serve ')
    assert "--max-concurrency 4 " in argv[2] and "--num-prompts 8 " in argv[2]
    assert f"--tokenizer {SAMPLE.model.path} " in argv[2]


def test_a_run_is_kept_per_lock_with_a_plot_and_compared_with_the_lock_before(
    tmp_path: Path,
) -> None:
    config = tmp_path / "c.yaml"
    with pytest.raises(VllmComposeError, match="no run under another lock"):
        bench.previous(config, None)
    first = bench.save(config, None, SWEEP, [result(1, 50.0, 40.0), result(4, 150.0, 60.0)])
    assert first.parent.name == "unlocked"
    assert json.loads(first.read_text())["results"][1]["output_throughput"] == 150.0
    height, width, _ = image.imread(first.with_suffix(".png")).shape
    assert (width, height) == (600, 400)
    moved = first.parent.with_name("0123456789ab")  # as a run under another lock would be
    first.parent.rename(moved)
    before = bench.previous(config, None)
    now = [result(1, 55.0, 30.0), result(16, 300.0, 90.0)]
    assert measure._changes(before["results"], now) == [
        "compare: concurrency 1: output 50 -> 55 tok/s (+10.0%), TTFT p50 40 -> 30 ms (-25.0%)"
    ]
