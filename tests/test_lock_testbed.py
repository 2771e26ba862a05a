"""Locks, drift and model sync on the testbed: real engines, the Ray stand-in image, model folders
private to each node."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import clusters, images
from tests.support.clusters import Pair, cli
from tests.support.testbed import MODELS, Node, Testbed, sh

WRAPPER = "vllm-compose:"

pytestmark = pytest.mark.testbed


@pytest.fixture
def pair(testbed: Testbed, tmp_path: Path) -> Iterator[tuple[Testbed, Path]]:
    yield testbed, tmp_path
    clusters.clean(testbed, tmp_path)
    clusters.place_standin_model(testbed)


def write(tmp: Path, bed: Testbed, model: str = clusters.STANDIN_MODEL) -> Path:
    return clusters.write_config(
        tmp / "c.yaml", "locked", bed.nodes[:2], images.STANDIN, model=model
    )


def wrappers(node: Node, forget: bool = False) -> set[str]:
    """The wrapper images' tags on the node (`forget`: untagged first, so a build shows)."""
    found = {t for i in node.docker.image.list() for t in i.repo_tags if t.startswith(WRAPPER)}
    if forget and found:
        node.docker.image.remove(list(found))
        return set()
    return found


def ok(result) -> str:  # type: ignore[no-untyped-def]
    assert result.returncode == 0, result.stderr
    return str(result.stdout)


def test_lock_then_render_is_reproducible_and_names_the_image_by_id(pair: Pair) -> None:
    bed, tmp = pair
    config = write(tmp, bed)
    wrappers(bed.nodes[0], forget=True)
    shown = ok(cli("lock", config, cwd=tmp))
    image_id = bed.nodes[0].docker.image.inspect(images.STANDIN).id
    assert f"locked {tmp / 'c.lock.json'}: {images.STANDIN} = {image_id}" in shown
    locked = json.loads((tmp / "c.lock.json").read_text())
    # Resolved with the wrapper over the base's ID, the one `up` then uses: built once.
    assert wrappers(bed.nodes[0]) == {locked["wrapper"]["tag"]}
    assert locked["versions"]["ray"] == "2.58.0"
    assert sorted(locked["model"]["files"]) == ["config.json", "weights.bin"]
    assert locked["model"]["files"]["weights.bin"]["size"] == 4096

    ok(cli("render", config, "-o", tmp / "one", cwd=tmp))
    ok(cli("render", config, "-o", tmp / "two", cwd=tmp))
    one = (tmp / "one/spark1/compose.yaml").read_bytes()
    assert one == (tmp / "two/spark1/compose.yaml").read_bytes()
    assert f'BASE_IMAGE: "{image_id}"' in one.decode()

    config.write_text(config.read_text().replace("port: 30000", "port: 30001"))
    changed = cli("render", config, cwd=tmp)
    assert changed.returncode == 1
    assert "the config changed since it was locked (its hash differs)" in changed.stderr


def test_a_node_holding_another_image_is_drift_until_the_lock_is_updated(pair: Pair) -> None:
    bed, tmp = pair
    head, worker = bed.nodes[:2]
    config = write(tmp, bed)
    ok(cli("lock", config, cwd=tmp))
    original = worker.docker.image.inspect(images.STANDIN).id
    bed.load_image(images.DEBIAN, nodes=[worker])
    sh("docker", "--context", worker.context, "tag", images.DEBIAN, images.STANDIN)
    try:
        drift = cli("up", config, cwd=tmp)
        assert drift.returncode == 1
        other = worker.docker.image.inspect(images.DEBIAN).id
        assert (
            f"  spark2 holds {images.STANDIN} as {other[:19]}, the lock says {original[:19]}"
        ) in drift.stderr.splitlines()
        assert "hint: make it match again, or accept the change with --update-lock" in drift.stderr
        assert clusters.containers(head, "locked") == {}

        wrappers(head, forget=True)
        accepted = ok(cli("up", config, "--update-lock", cwd=tmp))
        assert "ready: http://192.168.200.12:30000/v1" in accepted
        # Locked, rendered and built once: the wrapper the lock resolved with is the one served.
        assert "image on spark1: present" in accepted.splitlines()
        relocked = json.loads((tmp / "c.lock.json").read_text())
        assert wrappers(head) == {relocked["wrapper"]["tag"]}
    finally:
        sh("docker", "--context", worker.context, "tag", original, images.STANDIN)


def test_a_missing_or_corrupted_model_file_is_drift_and_sync_repairs_it(pair: Pair) -> None:
    bed, tmp = pair
    head, worker = bed.nodes[:2]
    config = write(tmp, bed)
    ok(cli("lock", config, cwd=tmp))
    bed.remove_path(worker, "standin-model/weights.bin")
    drift = cli("up", config, cwd=tmp)
    assert drift.returncode == 1  # preflight sees it first: the worker differs from the head
    assert f"{clusters.STANDIN_MODEL} differs from spark1's: missing: weights.bin" in drift.stderr

    # Same size, other bytes: only the hash shows it; sync checks every file against the lock.
    with (Path(worker.models) / "standin-model/config.json").open("r+b") as f:
        f.write(b"X")
    synced = ok(cli("sync-model", config, cwd=tmp))
    assert synced.strip().splitlines()[-1] == "spark2: 4.0 KiB moved, 0 files kept"
    assert (Path(worker.models) / "standin-model/weights.bin").read_bytes() == bytes(4096)
    assert (Path(worker.models) / "standin-model/config.json").read_bytes() == (
        Path(head.models) / "standin-model/config.json"
    ).read_bytes()

    again = ok(cli("sync-model", config, cwd=tmp))
    assert again.strip().splitlines()[-1] == "spark2: 0 B moved, 2 files kept"
    ok(cli("up", config, cwd=tmp))


def test_a_model_changed_on_every_node_is_lock_drift_and_never_synced(pair: Pair) -> None:
    """Head and worker changed alike: preflight (which compares nodes) passes, the lock does not,
    and a sync from a head that no longer matches the lock fails instead of spreading it."""
    bed, tmp = pair
    config = write(tmp, bed)
    ok(cli("lock", config, cwd=tmp))
    for node in bed.nodes[:2]:
        with (Path(node.models) / "standin-model/weights.bin").open("ab") as f:
            f.write(b"+")
    drift = cli("up", config, cwd=tmp)
    assert drift.returncode == 1
    lines = drift.stderr.splitlines()
    assert f"  spark1: {clusters.STANDIN_MODEL}: size: weights.bin" in lines
    assert f"  spark2: {clusters.STANDIN_MODEL}: size: weights.bin" in lines

    synced = cli("sync-model", config, cwd=tmp)
    assert synced.returncode == 1
    assert (
        "spark2: FAILED: vllm-compose-health: weights.bin: the source has 4097 bytes, the "
        "manifest says 4096"
    ) in synced.stdout
    assert "sync-model: 1 of 1 nodes do not hold the model" in synced.stderr


def test_an_hf_cache_snapshot_arrives_on_the_worker_as_real_files(pair: Pair) -> None:
    bed, tmp = pair
    head, worker = bed.nodes[:2]
    repo = Path(head.models) / "hub/models--t--tiny"
    snapshot = repo / "snapshots/0123abcd"
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    weights = os.urandom(2_000_000)
    (repo / "blobs/w").write_bytes(weights)
    link = snapshot / "model.safetensors"
    if not link.is_symlink():
        link.symlink_to("../../blobs/w")
    try:
        config = write(tmp, bed, model=f"{MODELS}/hub/models--t--tiny/snapshots/0123abcd")
        locked = ok(cli("lock", config, cwd=tmp))
        assert "revision 0123abcd" in locked
        synced = ok(cli("sync-model", config, cwd=tmp))
        assert synced.strip().splitlines()[-1] == "spark2: 1.9 MiB moved, 0 files kept"
        arrived = Path(worker.models) / "hub/models--t--tiny/snapshots/0123abcd/model.safetensors"
        assert not arrived.is_symlink() and arrived.read_bytes() == weights
    finally:
        bed.remove_path(head, "hub")
        bed.remove_path(worker, "hub")


def test_a_byte_flipped_after_verify_is_named_by_preflight_and_by_verify(pair: Pair) -> None:
    """One byte rewritten in place on the worker, same size: preflight names the file from its
    size and mtime as verify recorded them (no hashing), verify from its hash; after sync-model
    verify stamps it again and preflight passes."""
    bed, tmp = pair
    worker = bed.nodes[1]
    config = write(tmp, bed)
    ok(cli("lock", config, cwd=tmp))
    verified = ok(cli("verify", config, cwd=tmp))
    assert "verify: 2 files on each of 2 nodes match the lock" in verified
    assert (tmp / "c.state" / "model-stamps.json").exists()
    assert ok(cli("preflight", config, cwd=tmp))

    with (Path(worker.models) / "standin-model/weights.bin").open("r+b") as f:
        f.seek(1000)
        f.write(b"\x01")
    flagged = cli("preflight", config, cwd=tmp)
    assert flagged.returncode == 1
    changed = "weights.bin changed since verify hashed it (size or mtime)"
    assert f"spark2       {clusters.STANDIN_MODEL}: {changed}" in flagged.stdout
    named = cli("verify", config, cwd=tmp)
    assert named.returncode == 1
    assert "verify: 1 mismatch" in named.stderr
    assert "  spark2: weights.bin: sha256 differs from the lock" in named.stderr.splitlines()

    ok(cli("sync-model", config, cwd=tmp))
    ok(cli("verify", config, cwd=tmp))
    ok(cli("preflight", config, cwd=tmp))
