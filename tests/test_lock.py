"""The lock's logic alone (drift, pinning, the file), and the wrapper's model copy on loopback:
`vllm-compose-health manifest/send/receive` run as processes, as they run in the containers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from generator import config
from generator.base.errors import ConfigError
from generator.operations import lock
from generator.stack import render, slots
from tests.test_config import CASES

HEALTH = Path(__file__).parent.parent / "image" / "health.py"
CLUSTER = config.load(CASES / "sample.yaml")
ID = "sha256:" + "a" * 64


def locked(files: dict[str, dict[str, object]] | None = None) -> lock.Lock:
    model = {"revision": None, "files": files or {"a.bin": {"size": 3, "sha256": "1" * 64}}}
    return lock.make(CLUSTER, ID, [], {"vllm": "0.32.0"}, model)


def test_the_lock_pins_the_image_by_id_and_notices_a_changed_config() -> None:
    entry = locked()
    assert lock.pinned(CLUSTER, entry).image == ID
    assert entry.wrapper.tag == render.wrapper_tag(lock.pinned(CLUSTER, entry))
    assert lock.config_drift(CLUSTER, entry) == []
    changed = CLUSTER.model_copy(update={"env": {"NCCL_DEBUG": "INFO"}})
    assert lock.config_drift(changed, entry) == [
        "the config changed since it was locked (its hash differs)"
    ]


def test_the_port_picked_for_a_config_without_one_is_kept_in_the_lock() -> None:
    unported = config.parse(CASES.joinpath("sample.yaml").read_text().replace("port: 30000", ""))
    model: dict[str, object] = {"revision": None, "files": {}}
    picked = lock.make(slots.at(unported, 8002), ID, [], {}, model, unported.config_hash(), 8002)
    assert lock.config_drift(unported, picked) == []
    assert lock.pinned(unported, picked).vllm.port == 8002
    assert lock.pinned(CLUSTER, picked).vllm.port == 30000  # a config's own port wins
    assert lock.Lock.model_validate_json(lock.text(locked())).api_port is None


def test_image_drift_names_the_node_and_ignores_nodes_that_lack_it() -> None:
    other = "sha256:" + "b" * 64
    assert lock.image_drift(locked(), {"spark-1": ID, "spark-2": other, "spark-3": None}) == [
        f"spark-2 holds {CLUSTER.image} as {other[:19]}, the lock says {ID[:19]}"
    ]


def test_model_drift_by_names_and_sizes() -> None:
    entry = locked(
        {"a.bin": {"size": 3, "sha256": "1" * 64}, "b.bin": {"size": 5, "sha256": "2" * 64}}
    )
    path = CLUSTER.model.path
    assert lock.model_drift(entry, "n", {"a.bin": 3, "b.bin": 5}) == []
    assert lock.model_drift(entry, "n", {"a.bin": 4}) == [
        f"n: {path}: missing: b.bin",
        f"n: {path}: size: a.bin",
    ]
    assert lock.model_drift(entry, "n", None) == [f"n: {path} is missing"]


def test_the_lock_file_is_stable_json_beside_the_config(tmp_path: Path) -> None:
    config_file = tmp_path / "cluster.yaml"
    written = lock.write(config_file, locked())
    assert written == tmp_path / "cluster.lock.json"
    first = written.read_bytes()
    lock.write(config_file, locked())
    assert written.read_bytes() == first
    read = lock.read(config_file)
    assert read is not None and read.model_dump(mode="json") == json.loads(first)
    assert [p.name for p in tmp_path.iterdir()] == ["cluster.lock.json"]  # no temp file left


def health(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(HEALTH), *args], input=stdin, capture_output=True, text=True
    )


@pytest.fixture
def sender(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A model laid out like an HF cache snapshot (files are symlinks into blobs), served."""
    repo = tmp_path / "models--t--tiny"
    (repo / "blobs").mkdir(parents=True)
    snapshot = repo / "snapshots" / "0123abcd"
    (snapshot / "sub").mkdir(parents=True)
    (repo / "blobs" / "w").write_bytes(os.urandom(3_000_000))
    (repo / "blobs" / "c").write_text('{"model_type": "llama"}')
    (snapshot / "model.safetensors").symlink_to("../../blobs/w")
    (snapshot / "sub" / "config.json").symlink_to("../../../blobs/c")
    port = 45000 + os.getpid() % 1000
    proc = subprocess.Popen(
        [
            sys.executable,
            str(HEALTH),
            "send",
            "--root",
            str(snapshot),
            "--listen",
            f"127.0.0.1:{port}",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout and "sending" in proc.stdout.readline()
    try:
        yield snapshot, f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait()
    proc.terminate()
    proc.wait(timeout=10)
    proc.stdout.close()


def test_a_symlinked_snapshot_arrives_as_real_files_then_a_second_run_moves_nothing(
    sender: tuple[Path, str], tmp_path: Path
) -> None:
    snapshot, address = sender
    manifest = health("manifest", str(snapshot))
    assert manifest.returncode == 0, manifest.stderr
    listed = json.loads(manifest.stdout)
    assert listed["revision"] == "0123abcd"
    assert sorted(listed["files"]) == ["model.safetensors", "sub/config.json"]

    target = tmp_path / "copy"
    first = health("receive", "--root", str(target), "--source", address, stdin=manifest.stdout)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout.splitlines()[-1]) == {
        "done": True,
        "moved": 3_000_023,
        "kept": 0,
    }
    copied = target / "model.safetensors"
    assert (
        not copied.is_symlink()
        and copied.read_bytes() == (snapshot / "model.safetensors").read_bytes()
    )

    again = health("receive", "--root", str(target), "--source", address, stdin=manifest.stdout)
    assert json.loads(again.stdout.splitlines()[-1]) == {"done": True, "moved": 0, "kept": 2}


def test_a_corrupted_file_is_fetched_again_and_a_bad_source_never_reports_success(
    sender: tuple[Path, str], tmp_path: Path
) -> None:
    snapshot, address = sender
    manifest = json.loads(health("manifest", str(snapshot)).stdout)
    target = tmp_path / "copy"
    health("receive", "--root", str(target), "--source", address, stdin=json.dumps(manifest))
    with (target / "model.safetensors").open("r+b") as f:
        f.write(b"\xff" * 16)  # same size, other bytes
    fixed = health(
        "receive", "--root", str(target), "--source", address, stdin=json.dumps(manifest)
    )
    assert json.loads(fixed.stdout.splitlines()[-1]) == {
        "done": True,
        "moved": 3_000_000,
        "kept": 1,
    }

    manifest["files"]["sub/config.json"]["sha256"] = "0" * 64  # the source no longer matches
    (target / "sub" / "config.json").unlink()
    bad = health("receive", "--root", str(target), "--source", address, stdin=json.dumps(manifest))
    assert bad.returncode == 1
    assert "sub/config.json: sha256 differs from the manifest after the copy" in bad.stderr
    assert "done" not in bad.stdout
    assert not (target / "sub" / "config.json").exists()
    assert not (target / "sub" / "config.json.partial").exists()


def test_names_that_leave_the_model_folder_are_refused(
    sender: tuple[Path, str], tmp_path: Path
) -> None:
    _, address = sender
    hostile = {"files": {"../../etc/passwd": {"size": 1, "sha256": "0" * 64}}}
    result = health(
        "receive", "--root", str(tmp_path / "t"), "--source", address, stdin=json.dumps(hostile)
    )
    assert result.returncode != 0
    assert "refusing path '../../etc/passwd'" in result.stderr


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[1, 2]\n", ["the file must hold a mapping of the fields below its top level"]),
        (
            '{"config_hash": "x"}\n',
            [
                "tool: Field required",
                "image: Field required",
                "wrapper: Field required",
                "versions: Field required",
                "model: Field required",
            ],
        ),
        (
            "{\n",
            [
                "not a readable lock: Expecting property name enclosed in double quotes: line 2 column 1 (char 2)"
            ],
        ),
    ],
)
def test_a_lock_of_the_wrong_shape_is_refused_naming_the_field_and_nothing_is_written(
    text: str, expected: list[str], tmp_path: Path
) -> None:
    (tmp_path / "c.yaml").write_text((CASES / "sample.yaml").read_text())
    (tmp_path / "c.lock.json").write_text(text)
    result = subprocess.run(
        [sys.executable, "-m", "generator", "render", "c.yaml"],
        cwd=tmp_path, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.splitlines() == ["c.lock.json is invalid:", *(f"  {e}" for e in expected)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.lock.json", "c.yaml"]


@pytest.mark.parametrize("port", [0, -1, 70000, True, "8001", 8100, 9000])
def test_a_locked_api_port_is_one_a_slot_can_have_or_the_lock_is_refused(
    port: object, tmp_path: Path
) -> None:
    """A lock records only a port slots.py picked (8000 to 8099); anything else a hand or a tool
    wrote there is refused, never rendered."""
    data = json.loads(lock.text(locked()))
    data["api_port"] = port
    (tmp_path / "c.lock.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError) as refused:
        lock.read_file(tmp_path / "c.lock.json")
    assert [p.split(":")[0] for p in refused.value.problems] == ["api_port"], refused.value.problems
    data["api_port"] = 8042
    (tmp_path / "c.lock.json").write_text(json.dumps(data))
    assert lock.read_file(tmp_path / "c.lock.json").api_port == 8042
