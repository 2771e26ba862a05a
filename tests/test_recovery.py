"""Faults on the testbed while a group starts or serves: an engine that stops under `watch`, a link
cut during `up`, engines that restart under a running group. The serve process is the Ray
STAND-IN (tests/support/standin_vllm.py); the Ray cluster, engines, Compose and links are real.
(A killed worker under real vLLM is in test_e2e.py.)"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import clusters, faults, images
from tests.support.clusters import Background, Pair, cli, completion_from, containers
from tests.support.testbed import Node, Testbed

pytestmark = pytest.mark.testbed


@pytest.fixture
def stack(testbed: Testbed, tmp_path: Path) -> Iterator[tuple[Testbed, Path]]:
    yield testbed, tmp_path
    clusters.clean(testbed, tmp_path)


def write_config(path: Path, name: str, nodes: list[Node]) -> Path:
    return clusters.write_config(path, name, nodes, images.STANDIN)


def test_an_engine_that_stops_is_named_after_the_cap_and_the_others_are_left_clean(
    stack: Pair,
) -> None:
    bed, tmp = stack
    head, worker = bed.nodes[:2]
    config = write_config(tmp / "c.yaml", "enginestop", [head, worker])
    watch = ["--interval", "2", "--backoff", "1", "--max-recoveries", "2"]
    watcher = Background("up", config, "--watch", *watch, cwd=tmp)
    try:
        watcher.wait_for("watch: ok", 300)
        bed.stop_engine(worker)
        code = watcher.wait(600)
    finally:
        watcher.interrupt()
        bed.start_engine(worker)
    assert code == 1, watcher.output
    failed = [line for line in watcher.lines if "watch: recovery" in line and "failed" in line]
    assert len(failed) == 2, watcher.output
    assert all("node 'spark2'" in line and "does not answer" in line for line in failed)
    headline = "watch: gave up after 2 recoveries in a row; last problem: spark2: engine does not"
    gave_up = next(i for i, line in enumerate(watcher.lines) if line.startswith(headline))
    assert watcher.lines[gave_up + 1] == "  spark1: removed, the front door kept, volumes kept"
    assert watcher.lines[gave_up + 2].startswith("  spark2: failed: ")
    # The cause outlives the containers: each recreate and the give-up saved the logs first, and
    # the head's /tmp (Ray's session logs) stays until `down`, as does the front door (its
    # clients get a 503 with Retry-After, not a refused connection).
    saved = sorted((tmp / "c.state" / "logs").glob("*/spark1.log"))
    assert len(saved) >= 2 and "stand-in vllm: attached to Ray" in saved[0].read_text()
    assert any("giving up: logs not saved: spark2: " in line for line in watcher.lines)
    kept = clusters.uncached(clusters.leftovers(head, "enginestop"))
    assert kept == ["container enginestop-front-door-1", "volume enginestop_shared-tmp"]
    assert cli("down", config, cwd=tmp).returncode == 0
    assert clusters.leftovers(head, "enginestop") == []


def test_a_link_cut_during_up_is_named_and_leaves_no_container(stack: Pair) -> None:
    bed, tmp = stack
    head, worker = bed.nodes[:2]
    config = write_config(tmp / "c.yaml", "linkcut", [head, worker])
    upping = Background("up", config, "--join-timeout", "30", "--serve-timeout", "60", cwd=tmp)
    try:
        upping.wait_for("ray ...", 120)  # preflight passed: the link was up until now
        bed.link_down(worker)
        code = upping.wait(300)
    finally:
        upping.interrupt()
        bed.link_up(worker)
    assert code == 1, upping.output
    assert (
        "node 'spark2': phase 'ray-join' failed: not in Ray 30 s after the start" in upping.output
    )
    assert "192.168.200.12:29510" in upping.output  # what it could not reach: the head
    saved = next((tmp / "c.state" / "logs").glob("*/spark2.log")).read_text()
    assert "vllm-compose: waiting for the head at 192.168.200.12:29510" in saved
    # The same, and more, in one archive to send: the worker's lines, every container, the
    # compose files, how the start went; not one secret.
    bundle = clusters.bundled(next((tmp / "c.state" / "logs").glob("*.tar.gz")), config)
    assert "vllm-compose: waiting for the head at 192.168.200.12:29510" in bundle["spark2.log"]
    assert {"spark1.containers.json", "compose/spark2/compose.yaml"} <= set(bundle)
    start = json.loads(bundle["summary.json"])["last_start"]
    assert "ray" in start["phases"] and "phase 'ray-join' failed" in start["failed"]
    assert "rolled back on spark1: removed" in upping.output
    assert "rolled back on spark2: removed" in upping.output
    # Containers gone; the volumes stay (compile caches, Ray's session logs) until `down`.
    assert clusters.uncached(clusters.leftovers(head, "linkcut")) == ["volume linkcut_shared-tmp"]
    assert clusters.uncached(clusters.leftovers(worker, "linkcut")) == []


def test_up_after_engines_restart_and_bring_their_containers_back_recreates_nothing(
    stack: Pair,
) -> None:
    """Both engines restart (every container stops), then the group's containers are started
    again on each node as a boot script or another tool would, without waiting for anything
    (serve before the worker's Ray has joined). `up` converges: the same containers, nothing
    recreated, serving again."""
    bed, tmp = stack
    nodes = bed.nodes[:2]
    config = write_config(tmp / "c.yaml", "restored", nodes)
    assert cli("up", config, cwd=tmp).returncode == 0
    before = {n.name: ids(n) for n in nodes}
    for node in nodes:
        bed.stop_engine(node)
        bed.start_engine(node)
    for node in nodes:
        found = containers(node, "restored")
        for service in ("ray", "serve"):  # serve shares ray's PID namespace: ray first
            if service in found:
                node.docker.container.start(found[service])
    again = cli("up", config, cwd=tmp)
    assert again.returncode == 0, again.stderr
    assert "ready: http://192.168.200.12:30000/v1" in again.stdout
    assert {n.name: ids(n) for n in nodes} == before
    for node in nodes:
        assert all(c.state.running for c in containers(node, "restored").values())


def ids(node: Node) -> dict[str, str]:
    return {service: c.id for service, c in containers(node, "restored").items()}


def test_ctrl_c_stops_watch_within_two_seconds_every_time(stack: Pair) -> None:
    """Five times, at different points of the watch loop (in a check, in the pause between), and
    with SIGINT ignored by the parent as a shell's background job has it: exit 130 within 2 s,
    the group left serving."""
    bed, tmp = stack
    head, worker = bed.nodes[:2]
    config = write_config(tmp / "c.yaml", "ctrlc", [head, worker])
    assert cli("up", config, cwd=tmp).returncode == 0
    before = {s: c.id for s, c in containers(head, "ctrlc").items()}
    for i, pause in enumerate([0.0, 0.3, 1.0, 1.7, 2.5]):
        watcher = Background("watch", config, "--interval", "2", cwd=tmp, sigint_ignored=i % 2 == 1)
        try:
            watcher.wait_for("watch: ok", 120)
            time.sleep(pause)
            began = time.monotonic()
            code = watcher.interrupt(seconds=10)
            took = time.monotonic() - began
        finally:
            watcher.interrupt(seconds=0.1)
        assert code == 130, f"after {pause} s: {code}\n{watcher.output}"
        assert took <= 2, f"after {pause} s: stopped in {took:.1f} s"
        assert "watch: stopped; the group is left as it is" in watcher.output
    assert {s: c.id for s, c in containers(head, "ctrlc").items()} == before


def test_a_controller_that_loses_its_path_to_a_node_recreates_nothing(stack: Pair) -> None:
    """The worker's context stops answering while the worker runs on: watch asks the nodes it
    still reaches, finds every node alive in Ray and the canary answering, says so and keeps
    the group; with the path back, it is plainly ok again."""
    bed, tmp = stack
    head, worker = bed.nodes[:2]
    config = write_config(tmp / "c.yaml", "cutoff", [head, worker])
    assert cli("up", config, cwd=tmp).returncode == 0
    before = clusters.ids([head, worker], "cutoff")
    watcher = Background("watch", config, "--interval", "2", cwd=tmp)
    try:
        watcher.wait_for("watch: ok", 60)
        with bed.controller_cut_off(worker):
            for _ in range(3):  # three checks in a row, more than --failures
                kept = watcher.wait_for("watch: no path from here to spark2's engine", 90)
        assert kept.endswith(
            "but every node is alive in Ray as spark1 sees it and the canary answered on the"
            " head; kept"
        )
        watcher.wait_for("watch: ok", 60)
    finally:
        code = watcher.interrupt()
    assert code == 130, watcher.output
    assert not [line for line in watcher.lines if "failed" in line or "recover" in line]
    after = clusters.ids([head, worker], "cutoff")
    assert after == before


def test_watch_at_its_defaults_names_a_killed_container_from_its_event_and_starts_it_again(
    stack: Pair,
) -> None:
    """The worker's Ray container killed through its engine: watch, run as the README says (no
    options), names the node and the cause from the engine's events, not at its next check
    (30 s away), and starts that container again at once (Docker would not start a container
    killed so); the group's supervisors re-form the group around it, in the same containers."""
    bed, tmp = stack
    head, worker = bed.nodes[:2]
    config = write_config(tmp / "c.yaml", "killed", [head, worker])
    assert cli("up", config, cwd=tmp).returncode == 0
    before = clusters.ids([head, worker], "killed")
    watcher = Background("watch", config, cwd=tmp)
    try:
        watcher.wait_for("watch: ok", 120)
        time.sleep(1)  # the event streams are open by now
        worker.docker.container.kill(containers(worker, "killed")["ray"])
        # The kill's event (its die's in the same line, or the next when it comes later).
        watcher.wait_for("spark2: ray sent signal 9 through its engine", 60)
        assert "check failed" not in watcher.output  # no check had to notice it first
        watcher.wait_for("watch: recovery 1/5 now: starting spark2's ray again", 60)
        watcher.wait_for("watch: healed by watch (started again) and the supervisors in", 300)
        watcher.wait_for("watch: ok", 120)
    finally:
        code = watcher.interrupt()
    assert code == 130, watcher.output
    assert "recreat" not in watcher.output
    after = clusters.ids([head, worker], "killed")
    assert after == before  # started again, not made anew
    said = str(head.docker.container.logs(containers(head, "killed")["serve"]))
    assert f"the group broke: {worker.ip}:" in said, said[-2000:]  # re-formed by the supervisors


def test_a_front_door_killed_under_watch_is_started_again_alone_and_answers(stack: Pair) -> None:
    """The head's front door killed through its engine (Docker will not start it again): the
    group still serves, but no client reaches it. watch at its defaults starts the door again at
    once, as it was, touching nothing of the group, and asks it as a client would; a client's
    completion through it answers."""
    bed, tmp = stack
    head, worker = bed.nodes[:2]
    config = write_config(tmp / "c.yaml", "doorkill", [head, worker])
    assert cli("up", config, cwd=tmp).returncode == 0
    before = clusters.ids([head, worker], "doorkill")
    watcher = Background("watch", config, cwd=tmp)
    try:
        watcher.wait_for("watch: ok", 120)
        time.sleep(1)  # the event streams are open by now
        head.docker.container.kill(containers(head, "doorkill")["front-door"])
        watcher.wait_for("spark1: front-door sent signal 9 through its engine", 60)
        watcher.wait_for("watch: spark1's front-door not running; starting it again", 10)
        watcher.wait_for("front door: spark1: answers on port 30000", 60)  # asked by watch
        watcher.wait_for("watch: spark1's front-door started again", 10)
        url = "http://192.168.200.12:30000/v1/completions"
        assert completion_from(worker, url, config)["choices"]
    finally:
        code = watcher.interrupt()
    assert code == 130, watcher.output
    assert "recover" not in watcher.output and "check failed" not in watcher.output
    after = clusters.ids([head, worker], "doorkill")
    assert after == before  # started again, not made anew; the group untouched


def test_a_crash_docker_restarts_is_left_to_heal_and_watch_says_who_healed_it(
    stack: Pair,
) -> None:
    """The worker's supervisor (its container's first process) dies as a crash would, from
    outside its container but not through the engine: Docker starts the container again and the
    group's supervisors re-form the group. watch names it, waits, and says it healed by itself;
    nothing is recreated."""
    bed, tmp = stack
    head, worker = bed.nodes[:2]
    config = write_config(tmp / "c.yaml", "crashed", [head, worker])
    assert cli("up", config, cwd=tmp).returncode == 0
    before = {n.name: containers(n, "crashed")["ray"].id for n in (head, worker)}
    watcher = Background("watch", config, cwd=tmp)
    try:
        watcher.wait_for("watch: ok", 120)
        time.sleep(1)
        os.kill(faults.first_process(worker, "crashed", "ray"), signal.SIGKILL)
        named = watcher.wait_for("spark2: ray exited (exit 137)", 60)
        assert "through its engine" not in named
        watcher.wait_for("Docker starts it again and the group's supervisors re-form", 10)
        watcher.wait_for("watch: healed by Docker and the supervisors in", 180)
    finally:
        code = watcher.interrupt()
    assert code == 130, watcher.output
    assert "recreat" not in watcher.output.split("watch: ok", 1)[1]
    after = {n.name: containers(n, "crashed")["ray"].id for n in (head, worker)}
    assert after == before  # the same containers: started again, not made anew


def test_a_cut_link_is_named_from_the_supervisors_lines_and_left_to_them(stack: Pair) -> None:
    """The link between the nodes cut for longer than the group's grace, then restored: no
    container event comes, but the head's supervisors say their peer stopped answering; watch at
    its defaults names it from their log within seconds (its next check is 30 s away), waits while
    they break the group and form it again once the link is back, and recreates nothing."""
    bed, tmp = stack
    head, worker = bed.nodes[:2]
    config = write_config(tmp / "c.yaml", "cutlink", [head, worker])
    assert cli("up", config, cwd=tmp).returncode == 0
    before = {n.name: containers(n, "cutlink")["ray"].id for n in (head, worker)}
    watcher = Background("watch", config, cwd=tmp)
    try:
        watcher.wait_for("watch: ok", 120)
        time.sleep(2)  # the event and log streams are open by now
        cut = time.monotonic()
        bed.link_down(worker)
        try:
            named = watcher.wait_for("stopped answering", 10)
            assert "its supervisor" in named, named  # either side's, whichever looked first
            assert "check failed" not in watcher.output  # no check had to notice it first
            time.sleep(max(0.0, cut + 15 - time.monotonic()))  # past the group's grace (10 s)
        finally:
            bed.link_up(worker)
        watcher.wait_for("watch: healed by the supervisors in", 180)
    finally:
        code = watcher.interrupt()
    assert code == 130, watcher.output
    assert "recreat" not in watcher.output.split("watch: ok", 1)[1]
    after = {n.name: containers(n, "cutlink")["ray"].id for n in (head, worker)}
    assert after == before  # the same containers: the supervisors re-formed the group in them
    said = str(head.docker.container.logs(containers(head, "cutlink")["serve"]))
    assert "has not answered for 10 s" in said, said[-2000:]  # broken, then formed again
