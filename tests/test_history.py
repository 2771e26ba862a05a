"""The history of stacks that served (generator/operations/history.py), in a temporary folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from generator.base.errors import VllmComposeError
from generator.operations import history


def test_history_records_each_stack_that_served_once_and_keeps_the_newest(tmp_path: Path) -> None:
    config_path = tmp_path / "c.yaml"
    with pytest.raises(VllmComposeError, match="no earlier stack to go back to"):
        history.before_latest(config_path)
    first = history.record(config_path, "a: 1\n", None)
    assert history.record(config_path, "a: 1\n", None) == first  # the same stack: no new entry
    second = history.record(config_path, "a: 2\n", None)
    assert [e.folder for e in history.entries(config_path)] == [first.folder, second.folder]
    assert history.before_latest(config_path).config_text == "a: 1\n"
    assert second.locked is None and not (second.folder / history.LOCK).exists()
    for i in range(history.KEEP + 3):
        history.record(config_path, f"a: {i + 3}\n", None)
    kept = history.entries(config_path)
    assert len(kept) == history.KEEP and kept[-1].config_text == f"a: {history.KEEP + 5}\n"


def test_an_entry_without_its_config_is_not_one(tmp_path: Path) -> None:
    config_path = tmp_path / "c.yaml"
    (history.folder_for(config_path) / "20261201T000000.000000Z").mkdir(parents=True)
    assert history.entries(config_path) == []
