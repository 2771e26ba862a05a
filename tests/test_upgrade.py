"""`upgrade` and `rollback` with real vLLM (native backend) on the emulated pair: a staging
failure never touches the serving group; a new base image whose vLLM fails at start, and a new
config whose golden prompt gets the wrong answer, both roll back by themselves and the old stack
answers; `check` records the healthy group's answers, a good upgrade that changes them is named
by its canary and, accepted, serves; and `rollback` goes back to the stack before it. The front
door is one container throughout: it holds the clients' requests through every switch. Then the
same group through a power cut of both nodes."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import clusters, derived, faults, images
from tests.support.clusters import Pair, cli
from tests.support.faults import answers
from tests.support.testbed import Node, Testbed
from tests.test_e2e import config

pytestmark = pytest.mark.testbed

BROKEN = "vllm-compose-test/vllm-broken:1"  # vLLM that fails at start (TEST-ONLY image)


@pytest.fixture
def pair(vllm_testbed: Testbed, tmp_path: Path) -> Iterator[tuple[Testbed, Path]]:
    yield vllm_testbed, tmp_path
    clusters.clean(vllm_testbed, tmp_path)


def broken_image(bed: Testbed, base: str) -> str:
    """The test vLLM image with a `vllm` that exits at start the way a bad build does: one layer
    over the base, which the nodes hold already (tests/support/derived.py)."""
    script = (
        b"#!/bin/sh\necho 'RuntimeError: this vLLM build cannot start on this node' >&2\nexit 1\n"
    )
    derived.load(base, BROKEN, {"usr/local/bin/vllm": (script, 0o755)}, bed.nodes[:2])
    return BROKEN


def serving_ids(bed: Testbed) -> list[str]:
    return [c.id for n in bed.nodes[:2] for c in clusters.containers(n, "upg").values()]


def test_upgrade_stages_first_rolls_back_by_itself_and_rollback_goes_back(pair: Pair) -> None:
    bed, tmp = pair
    head, worker = bed.nodes[:2]
    path = config(tmp, bed, "upg", "native")
    good = path.read_text()
    assert cli("up", path, cwd=tmp, timeout=600).returncode == 0
    key, lock_file = clusters.api_key(path), tmp / "upg.lock.json"
    before, first_lock = serving_ids(bed), lock_file.exists() and lock_file.read_text()
    door = clusters.containers(head, "upg")["front-door"].id  # it holds requests throughout
    checked = cli("check", path, cwd=tmp)
    assert checked.returncode == 0, checked.stderr
    recorded = (tmp / "upg.answers.json").read_text()

    # Staging fails (no such image anywhere): the old group is never touched.
    path.write_text(good.replace(f"image: {images.VLLM}", "image: nowhere/none:1"))
    staged = cli("upgrade", path, cwd=tmp, timeout=600)
    assert staged.returncode != 0 and "switch:" not in staged.stderr, staged.stderr
    assert serving_ids(bed) == before and answers(worker, key)
    assert (lock_file.exists() and lock_file.read_text()) == first_lock

    # A new image whose vLLM fails at start is rolled back the same way: tests/test_replicas.py
    # (on the first replica, the second never touched).

    # A golden prompt whose answer cannot match: rolled back, the old stack answers.
    never = good + "canary: {prompt: 'Hello', expect: '^never this$'}\n"
    path.write_text(never.replace("max_model_len: 256", "max_model_len: 200"))
    wrong = cli("upgrade", path, cwd=tmp, timeout=900)
    assert wrong.returncode == 1, wrong.stderr
    assert "does not match '^never this$'; rolled back" in wrong.stderr, wrong.stderr
    assert answers(worker, key)

    # A good upgrade (any answer matches) whose repetition penalty changes the greedy answers
    # `check` recorded: named, accepted and recorded anew. It adds a tool-call and a reasoning
    # parser that need no special tokens (the tiny model has none), which `check` then exercises.
    # Then rollback to the stack before it.
    penalty = (
        "--enforce-eager, --override-generation-config, '{\"repetition_penalty\": 3.0}',"
        " --enable-auto-tool-choice, --tool-call-parser, pythonic, --reasoning-parser, granite"
    )
    changed = good.replace("max_model_len: 256", "max_model_len: 200")
    path.write_text(changed.replace("--enforce-eager", penalty)
                    + "canary: {prompt: 'Hello', expect: '(?s).'}\n")  # fmt: skip
    upgraded = cli("upgrade", path, "--accept-changed-answers", cwd=tmp, timeout=900)
    print(upgraded.stderr)
    assert upgraded.returncode == 0, upgraded.stderr
    assert "canary: the answers changed (prompt " in upgraded.stderr
    assert "); accepted and recorded" in upgraded.stderr
    assert (tmp / "upg.answers.json").read_text() != recorded
    assert "downtime: " in upgraded.stdout and answers(worker, key)
    assert max_model_len(head) == 200
    parsed = cli("check", path, cwd=tmp)
    print(parsed.stdout, parsed.stderr)
    assert parsed.returncode == 0, parsed.stdout + parsed.stderr
    assert "check: golden: ok: the 4 recorded answers, unchanged" in parsed.stdout
    assert "check: context: ok: 200 tokens answered, 201 refused cleanly (400)" in parsed.stdout
    assert re.search(r"check: tool-call parser: ok: \d+ tool call\(s\) parsed", parsed.stdout)
    assert "check: reasoning parser: ok: " in parsed.stdout
    back = cli("rollback", path, cwd=tmp, timeout=900)
    assert back.returncode == 0, back.stderr
    assert answers(worker, key) and max_model_len(head) == 256
    assert len(list((tmp / "upg.state" / "history").iterdir())) == 3  # up, upgrade, rollback
    assert clusters.containers(head, "upg")["front-door"].id == door  # never recreated
    # The stack rolled back to serves through a power cut of both nodes, as every stack does:
    # its containers restart, never recreated. (Each node's alone: the Ray backend's, in
    # tests/test_e2e.py; the native group's lost member: its killed worker, there too.)
    faults.survives_power_cuts(bed, path, "upg", "both")


def max_model_len(node: Node) -> int:
    command = node.docker.container.inspect("upg-serve-1").config.cmd or []
    return int(command[command.index("--max-model-len") + 1])
