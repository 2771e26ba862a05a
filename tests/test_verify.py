"""The model's stamps and verify's comparison, on their own: what preflight names as changed
since verify hashed it, and each mismatch verify names. (On real nodes: test_lock_testbed.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from generator.operations import checks as checking
from generator.operations import stamps
from generator.operations.verify import mismatches
from tests.test_preflight import BASE, SAMPLE, healthy

PATH = SAMPLE.model.path
MTIMES = {"config.json": 1_000, "model-00001.safetensors": 2_000}
RECORDED = {"config.json": (700, 1_000), "model-00001.safetensors": (5_000_000_000, 2_000)}


def model_failures(seen: dict[str, dict[str, Any]], stamped: stamps.Stamps | None) -> list[str]:
    typed = {node: checking.Facts.model_validate(found) for node, found in seen.items()}
    found = checking.evaluate(SAMPLE, typed, {"spark-1": BASE, "spark-2": BASE}, stamped=stamped)
    return [f"{c.node}: {c.cause}" for c in found if c.status == "fail" and c.name == "model"]


def test_a_file_whose_mtime_changed_since_verify_is_named_without_hashing() -> None:
    seen = healthy()
    for node in seen.values():
        node["model_mtimes"] = dict(MTIMES)
    stamped = stamps.Stamps(model=PATH, nodes={"spark-1": RECORDED, "spark-2": RECORDED})
    assert model_failures(seen, stamped) == []
    seen["spark-2"]["model_mtimes"]["config.json"] = 1_001  # one byte rewritten in place
    assert model_failures(seen, stamped) == [
        f"spark-2: {PATH}: config.json changed since verify hashed it (size or mtime)"
    ]
    assert model_failures(seen, None) == []  # without stamps: sizes alone, as before


def test_stamps_are_merged_per_node_and_forgotten_for_a_node_found_wrong(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    assert stamps.read(config, PATH) is None
    stamps.record(config, PATH, {"spark-1": RECORDED, "spark-2": RECORDED})
    stamps.record(config, PATH, {"spark-2": None})
    found = stamps.read(config, PATH)
    assert found is not None and found.nodes == {"spark-1": RECORDED}
    assert stamps.read(config, "/another/model") is None  # another model: no stamps
    stamps.path_for(config).write_text("{not json")
    assert stamps.read(config, PATH) is None  # unreadable: preflight checks sizes alone


def test_verify_names_each_file_missing_extra_resized_or_with_another_hash() -> None:
    want = {
        "a": {"size": 1, "sha256": "1"},
        "b": {"size": 2, "sha256": "2"},
        "c": {"size": 3, "sha256": "3"},
        "d": {"size": 4, "sha256": "4"},
    }
    have = {
        "a": {"size": 1, "sha256": "1", "mtime_ns": 5},
        "b": {"size": 2, "sha256": "x", "mtime_ns": 5},
        "c": {"size": 9, "sha256": "3", "mtime_ns": 5},
        "e": {"size": 5, "sha256": "5", "mtime_ns": 5},
    }
    assert mismatches(want, have, "the lock") == [
        "d: missing",
        "e: not in the lock",
        "c: size differs",
        "b: sha256 differs from the lock",
    ]
    assert mismatches(want, want, "the lock") == []
