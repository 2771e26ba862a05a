"""Replicas with real vLLM (CPU build) on the emulated nodes: two groups of the tiny model, TP=1 each,
one per node, behind the first node's front door (config `replicas: 2`), brought up by `vllm-compose
up`: a load through the door is shared between them; Prometheus scrapes each one; status, top, ls
and diagnose show each replica and bench measures one; an upgrade rolls replica by replica under
load with no failed request (a broken image rolled back on the first, the second never touched); and
one replica's vLLM killed under load, with watch running, costs no request that had not started its
answer, is started again by watch and rejoins the door's rotation."""

from __future__ import annotations

import collections
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support import clusters, faults, images
from tests.support.clusters import Pair, cli
from tests.support.load import Load
from tests.support.testbed import Node
from tests.test_e2e import MODEL, config
from tests.test_e2e import pair as pair  # the fixture
from tests.test_upgrade import broken_image

pytestmark = pytest.mark.testbed

URL = "http://192.168.200.12:30000/v1/chat/completions"  # the first node's door
# Each replica's vLLM on one thread: the emulated nodes share this machine's two cores, and two
# CPU vLLMs each binding both spin against each other (an answer of 25 ms took 0.5 s when the
# two were asked in turn); one thread each is one core each, as on nodes of their own.
REPLICAS = 'replicas: 2\nenv: {VLLM_CPU_OMP_THREADS_BIND: nobind, OMP_NUM_THREADS: "1"}'


def served_by(bed_head_logs: str) -> collections.Counter[str]:
    """Which replica the door sent each answered request to, from its log lines (`%b/%s`)."""
    return collections.Counter(re.findall(r" replicas/(replica-\d) \S+ 200 ", bed_head_logs))


def ids(node: Node) -> dict[str, str]:
    return {name: c.id for name, c in clusters.containers(node, "twins").items()}


def seen_by_top(path: Path, tmp: Path) -> dict[str, Any]:
    shown = cli("top", path, "--once", "--json", cwd=tmp)
    assert shown.returncode == 0, shown.stderr
    return dict(json.loads(shown.stdout))


def max_model_len(node: Node) -> int:
    command = node.docker.container.inspect("twins-serve-1").config.cmd or []
    return int(command[command.index("--max-model-len") + 1])


def test_two_replicas_share_a_load_roll_an_upgrade_and_a_lost_one_costs_no_request(
    pair: Pair,
) -> None:
    bed, tmp = pair
    head, other = bed.nodes[:2]
    clusters.load_metrics(bed, [head, other])
    path = config(tmp, bed, "twins", "native", extra=f"{REPLICAS}\n{clusters.METRICS}")
    up = cli("up", path, cwd=tmp)
    assert up.returncode == 0, up.stderr[-3000:]
    assert "replica 2: serve ..." in up.stderr and "replica 2 phases:" in up.stdout, up.stdout
    print(up.stdout)

    # A bounded load, one request at a time, each a moment after the last: each replica answers
    # 30-70% of it. (With four clients leastconn follows each replica's speed, which on the
    # testbed's two shared cores swings from run to run: 18-82% to 39-62% were seen; with no
    # pause, a pick that came before the door let go of the last request was skewed, 80-20
    # once.)
    door = clusters.containers(head, "twins")["front-door"]
    load = Load(URL, clusters.api_key(path), MODEL, seconds=8, pause=0.1)
    with load.running(1):
        while not load.spent():
            time.sleep(1)
    assert [r.error for r in load.done if not r.ok] == []
    logged = str(head.docker.container.logs(door))
    shares = served_by(logged)
    total = sum(shares.values())
    said = [line for line in logged.splitlines() if "Server replicas/" in line]
    print(f"shares: {dict(shares)}", *said, sep="\n")
    assert total >= 10 and all(
        0.3 <= shares[r] / total <= 0.7 for r in ("replica-1", "replica-2")
    ), shares
    # The first node's Prometheus scrapes each replica's vLLM, labelled with its replica (the
    # second's at its node's IP, with the key), and the door's counts of what each one answered.
    scraped = clusters.promql(other, "sum by (replica) (vllm:request_success_total) > 0", 2)
    assert sorted(r["metric"]["replica"] for r in scraped) == ["1", "2"], scraped
    counted = clusters.promql(other, 'front_door_replica_requests_total{code="200"} > 0', 2)
    assert sorted(r["metric"]["replica"] for r in counted) == ["replica-1", "replica-2"]
    status = cli("status", path, cwd=tmp)  # each node's replica, and each one's share
    assert "spark2 (192.168.200.13), replica 2" in status.stdout, status.stdout
    assert re.search(r"front door: replica-2: UP, 0 under way, \d+% of", status.stdout), (
        status.stdout
    )
    # top, diagnose and ls show each replica (top: its load, its state and share at the door);
    # bench measures replica 2's vLLM alone, past the door.
    shown = seen_by_top(path, tmp)
    assert [(r["replica"], r["door"]) for r in shown["replicas"]] == [(1, "UP"), (2, "UP")]
    assert all(r["endpoint"] for r in shown["replicas"]) and shown["endpoint"], shown
    assert 99 <= sum(r["share_percent"] for r in shown["replicas"]) <= 101, shown
    bundle = cli("diagnose", path, cwd=tmp).stdout.strip()
    summary = json.loads(clusters.bundled(Path(bundle), path)["summary.json"])
    assert [(r["nodes"], r["door"]) for r in summary["replicas"]] == [
        (["spark1"], "UP"), (["spark2"], "UP")]  # fmt: skip
    listed = json.loads(cli("ls", path, "--json", cwd=tmp).stdout)["clusters"]
    assert [(c["replicas"], c["endpoint"]) for c in listed] == [
        ({"spark1": 1, "spark2": 2}, "http://192.168.200.12:30000/v1")]  # fmt: skip
    sweep = ["--replica", "2", "--concurrency", "1", "--prompts", "4", "--json"]
    measured = cli("bench", path, *sweep, cwd=tmp)
    assert measured.returncode == 0, measured.stderr
    assert json.loads(measured.stdout)["results"][0]["completed"] == 4, measured.stdout
    after = seen_by_top(path, tmp)  # the door sent none of them
    assert [r["requests"] for r in after["replicas"]] == [r["requests"] for r in shown["replicas"]]

    # An upgrade under load rolls replica by replica, each drained first: no request fails.
    good = path.read_text()
    path.write_text(good.replace("max_model_len: 256", "max_model_len: 200"))
    rolling = Load(URL, clusters.api_key(path), MODEL, seconds=300, pause=0.2)
    with rolling.running(2) as load:
        rolled = cli("upgrade", path, cwd=tmp, timeout=600)
    print(rolled.stdout)
    assert rolled.returncode == 0, rolled.stderr[-3000:]
    assert "drain: replica 2: no new requests" in rolled.stderr, rolled.stderr
    assert [r.error for r in load.done if not r.ok] == [], len(load.done)
    assert max_model_len(head) == max_model_len(other) == 200
    longest = max(r.end - r.start for r in load.done)
    print(f"rolling upgrade: {len(load.done)} requests, none failed, the longest {longest:.2f} s")

    # A broken image: the first replica's start fails and it serves as before again; the
    # second is never touched.
    untouched = ids(other)
    path.write_text(good.replace(images.VLLM, broken_image(bed, images.VLLM)))
    broken = cli("upgrade", path, cwd=tmp, timeout=600)
    assert broken.returncode == 1 and "phase 'serve' failed" in broken.stderr, broken.stderr
    assert "; rolled back: the stack of " in broken.stderr, broken.stderr
    assert ids(other) == untouched and max_model_len(head) == 200
    assert faults.answers(head, clusters.api_key(path))

    # Replica 2's vLLM killed under load, `up --watch` at its defaults: the door moves what it had
    # not begun to answer to replica 1; watch names the kill and starts it again, and it rejoins
    # the door's rotation once its checks pass. (The load is lighter while it starts again: on
    # the testbed's two cores, four clients of the other replica slowed its start from 20 s to
    # over 90.)
    before = len(load.done)
    path.write_text(good.replace("max_model_len: 256", "max_model_len: 200"))  # as it serves
    watcher = clusters.Background("up", path, "--watch", cwd=tmp)
    try:
        watcher.wait_for("replica 2: watch: ok", 300)
        with Load(URL, clusters.api_key(path), MODEL, seconds=9).running(4) as load:
            time.sleep(3)
            other.docker.container.kill(clusters.containers(other, "twins")["serve"])
            killed = time.monotonic()
            watcher.wait_for("replica 2: watch: spark2: serve sent signal 9", 60)
            while not load.spent():
                time.sleep(1)
        with Load(URL, clusters.api_key(path), MODEL, seconds=200, pause=0.2).running(1) as light:
            watcher.wait_for("replica 2: watch: healed by watch", 180)
            served = served_by(str(head.docker.container.logs(door)))["replica-2"]
            while served_by(str(head.docker.container.logs(door)))["replica-2"] <= served:
                assert not light.spent(), "replica 2 did not rejoin the door's rotation"
                time.sleep(1)
            rejoined = time.monotonic() - killed
    finally:
        assert watcher.interrupt() == 130, watcher.output
    failed = [r for r in load.done if not r.ok]
    # No plain request that had not begun its answer (one whose headers had come, its body cut
    # by the kill, was seen once in CI: an answer under way, as a stream's).
    begun = [r for r in failed if r.error.startswith("IncompleteRead")]
    assert [r.error for r in failed if not r.streamed and r not in begun] == [], failed
    # A stream cut in its answer ends with the door's error event: at most those under way.
    assert len(failed) <= 4 and all(r.start <= killed for r in failed), failed
    assert len(load.answered_after(killed + 1)) > 10, len(load.done)
    assert [r.error for r in light.done if not r.ok] == [], len(light.done)
    waits = [r.end - r.start for r in load.done]
    print(
        f"lost replica: {len(load.done)} requests, {len(failed)} failed, longest {max(waits):.2f} s"
        f" (before: {before}); back in the door's rotation {rejoined:.0f} s after the kill,"
        f" {len(light.done)} requests meanwhile, none failed"
    )
    down = cli("down", path, cwd=tmp)
    assert down.returncode == 0, down.stderr
    # Compile caches aside: the upgraded-from stack's is kept for a rollback (clusters.uncached).
    for node in (head, other):
        assert clusters.uncached(clusters.leftovers(node, "twins")) == []
