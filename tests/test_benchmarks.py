"""BENCHMARKS.md is generated from the benchmarks' results (benchmarks/report.py): our logic."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from benchmarks import report


def test_benchmarks_md_is_what_the_latest_results_generate() -> None:
    text = report.render(report.latest())
    assert report.GENERATED.read_text() == text, "regenerate: python -m benchmarks.report"
    assert len(text.splitlines()) <= 300


def test_a_run_is_recorded_with_its_command_commit_machine_and_goal_and_the_latest_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    monkeypatch.setattr(report, "ROOT", tmp_path)
    monkeypatch.setattr(sys, "argv", ["/x/benchmarks/door_cost.py", "--rounds", "4"])
    old = report.record("The door", "What it does.", "<= 2 ms", [report.Figure("a", "1 ms")])
    old.rename(old.with_name("20000101T000000Z.json"))  # an earlier run
    figures = [report.Figure("TTFT", "+1.5 ms", "<= +2 ms", True),
               report.Figure("tok/s", "0.95x", ">= 0.98x", False)]  # fmt: skip
    path = report.record("The door", "What it does.", "<= 2 ms", figures, ["a note"])
    kept = json.loads(path.read_text())
    assert kept["command"] == "python -m benchmarks.door_cost --rounds 4"
    assert (
        kept["benchmark"] == "door_cost" and kept["commit"] and kept["machine"].count("vCPU") == 1
    )
    [latest] = report.latest(tmp_path)
    assert latest.figures == figures and latest.met == "1 of 2 not met"
    text = report.render([latest])
    assert "| TTFT | +1.5 ms | <= +2 ms | yes |" in text
    assert "| tok/s | 0.95x | >= 0.98x | **no** |" in text
    assert "`python -m benchmarks.door_cost --rounds 4` at " in text and "- a note" in text
