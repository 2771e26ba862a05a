"""The files the tool reads before it asks an engine anything (golden answers, bench runs, the
lock, history), the options it must not drop, and settings it must not take: each refused with
exit 2, naming the file or field, before anything is written or asked. The config's contexts do
not exist here: a command that asked an engine would fail with Docker's words, not these."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from generator.operations import history
from tests.test_cli import CASES, run


@pytest.fixture
def place(tmp_path: Path) -> Path:
    shutil.copy(CASES / "sample.yaml", tmp_path / "c.yaml")
    return tmp_path


def refused(said: object, *words: str) -> None:
    import subprocess

    assert isinstance(said, subprocess.CompletedProcess)
    assert said.returncode == 2, said.stdout + said.stderr
    assert "Traceback" not in said.stderr and "context" not in said.stderr, said.stderr
    for word in words:
        assert word in said.stderr, said.stderr


@pytest.mark.parametrize("what", ["not JSON", "a list", "a link", "2 MiB", "an answer short"])
def test_golden_answers_that_cannot_be_read_are_refused_before_check_or_upgrade_asks(
    place: Path, what: str
) -> None:
    answers = place / "c.answers.json"
    if what == "not JSON":
        answers.write_text("{not json")
    elif what == "a list":
        answers.write_text("[1, 2]")
    elif what == "a link":
        (place / "elsewhere.json").write_text("{}")
        answers.symlink_to(place / "elsewhere.json")
    elif what == "2 MiB":
        answers.write_text(json.dumps({"prompts": [], "answers": [], "pad": "x" * (2 << 20)}))
    else:
        answers.write_text(json.dumps({"prompts": ["a", "b"], "answers": [{"status": 200}]}))
    refused(run("check", "c.yaml", cwd=place), "c.answers.json")
    history.record(place / "c.yaml", (place / "c.yaml").read_text(), None)
    refused(run("upgrade", "c.yaml", cwd=place), "c.answers.json")
    assert len(history.entries(place / "c.yaml")) == 1  # nothing switched, nothing recorded


def test_bench_refuses_what_it_can_before_it_asks_an_engine(place: Path) -> None:
    refused(run("bench", "c.yaml", "--compare", cwd=place), "no run without failed requests")
    refused(run("bench", "c.yaml", "--prefix", "--input-len", "1", cwd=place), "share no prefix")
    (place / "c.state").mkdir(mode=0o700)
    (place / "elsewhere").mkdir()
    (place / "c.state" / "bench").symlink_to(place / "elsewhere")
    refused(run("bench", "c.yaml", cwd=place), "is a link")
    assert list((place / "elsewhere").iterdir()) == []


def test_a_bench_run_that_is_not_ours_is_never_a_baseline(place: Path) -> None:
    from generator.operations import benchruns

    runs = place / "c.state" / "bench" / "older"
    runs.mkdir(parents=True)
    (runs / "1.json").write_text('{"results": [{"max_concurrency": "x"}], "sweep": {}}')
    (runs / "2.json").write_text("[]")
    (runs / "3.json").symlink_to(place / "c.yaml")
    with pytest.raises(Exception, match="no run without failed requests"):
        benchruns.previous(place / "c.yaml", None)


@pytest.mark.parametrize(
    "args,words",
    [
        (["top", "c.yaml", "--json"], ["--json goes with --once"]),
        (["up", "c.yaml", "--interval", "5"], ["up --interval", "add --watch"]),
        (["up", "c.yaml", "--heal", "30"], ["up --heal", "add --watch"]),
    ],
)
def test_an_option_that_would_be_dropped_is_refused(
    place: Path, args: list[str], words: list[str]
) -> None:
    refused(run(*args, cwd=place), *words)


@pytest.mark.parametrize(
    "lock,words",
    [
        ("[" * 100_000 + "]" * 100_000, ["nested too deep"]),
        ("ID", ["image.id"]),
        ("DOTS", ["model.files", "not a file under the model's folder"]),
    ],
)
def test_a_lock_that_is_not_one_is_refused_by_field(
    place: Path, lock: str, words: list[str]
) -> None:
    good = {
        "tool": "0.1.0", "config_hash": "x", "versions": {},
        "image": {"ref": "img:1", "id": "sha256:" + "a" * 64, "digests": []},
        "wrapper": {"tag": "vllm-compose:abc"},
        "model": {"path": "/models/m", "revision": None,
                  "files": {"a.bin": {"size": 1, "sha256": "b" * 64}}},
    }  # fmt: skip
    if lock == "ID":
        good["image"]["id"] = ""  # type: ignore[index]
        lock = json.dumps(good)
    elif lock == "DOTS":
        good["model"]["files"] = {"../../etc/passwd": {"size": 1, "sha256": "b" * 64}}  # type: ignore[index]
        lock = json.dumps(good)
    (place / "c.lock.json").write_text(lock)
    refused(run("render", "c.yaml", cwd=place), "c.lock.json", *words)


def test_a_config_whose_file_name_is_not_utf8_is_refused(place: Path) -> None:
    import os
    import subprocess
    import sys

    name = os.fsdecode(b"c\xff.yaml")
    shutil.copy(place / "c.yaml", place / name)
    said = subprocess.run([sys.executable, "-m", "generator", "render", name], cwd=place,
                          capture_output=True, text=True, errors="replace", check=False)  # fmt: skip
    refused(said, "the config's file name is not UTF-8")
    assert not (place / "compose").exists()


def test_rollback_to_an_entry_that_is_no_valid_config_names_the_entry(place: Path) -> None:
    config = place / "c.yaml"
    old = history.record(config, config.read_text().replace("backend: ray", "backend: nope"), None)
    history.record(config, config.read_text(), None)
    said = run("rollback", "c.yaml", cwd=place)
    entry = old.folder.relative_to(place)
    assert said.returncode == 2 and f"{entry}/config.yaml is invalid" in said.stderr


@pytest.mark.parametrize(
    "extra,words",
    [
        ("metrics: {listen: 224.0.0.1}", ["metrics.listen: 224.0.0.1 is no address"]),
        ("backend: native\nmetrics: {ray_port: 9200}", ["metrics.ray_port: backend native"]),
        ("ray: {object_store_memory: 100000000000000000000000000000}", ["ray.object_store_memory"]),
    ],
)
def test_settings_that_cannot_mean_what_they_say_are_refused(
    place: Path, extra: str, words: list[str]
) -> None:
    text = (place / "c.yaml").read_text().replace("backend: ray\n", "")
    (place / "c.yaml").write_text(text + extra + "\n")
    said = run("validate", "c.yaml", cwd=place)
    assert said.returncode == 2 and all(w in said.stderr for w in words), said.stderr


def test_ray_metrics_turned_on_in_env_is_warned_of(place: Path) -> None:
    text = (
        (place / "c.yaml")
        .read_text()
        .replace("NCCL_DEBUG: WARN", "RAY_enable_metrics_collection: '1'")
    )
    (place / "c.yaml").write_text(text)
    said = run("validate", "c.yaml", cwd=place)
    assert said.returncode == 0 and "warning: env.RAY_enable_metrics_collection: on" in said.stderr
