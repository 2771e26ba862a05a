"""`vllm-compose up/down/status/logs` on the multi-node testbed: real engines, real Compose, real
Ray across network namespaces. The serve process is the Ray STAND-IN (tests/support/standin_vllm.py)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from python_on_whales import Container, DockerClient

from tests.support import clusters, images
from tests.support.clusters import Pair, cli, completion_from, containers
from tests.support.testbed import Node, Testbed

pytestmark = pytest.mark.testbed


def write_config(
    path: Path, name: str, nodes: list[Node], contexts: list[str] | None = None
) -> Path:
    return clusters.write_config(path, name, nodes, images.STANDIN, contexts)


@pytest.fixture
def stack(testbed: Testbed, tmp_path: Path) -> Iterator[tuple[Testbed, Path]]:
    yield testbed, tmp_path
    clusters.clean(testbed, tmp_path)


def first_healthy(container: Container, seconds: float) -> datetime:
    """When its health check first passed (waiting up to `seconds` for one to run)."""
    deadline = time.monotonic() + seconds
    while True:
        health = container.state.health  # re-inspected when read (python-on-whales's cache)
        log = health.log or [] if health else []
        passed = [e.end for e in log if e.exit_code == 0 and e.end]
        if passed:
            return passed[0]
        assert time.monotonic() < deadline, f"{container.name} never passed its health check"
        time.sleep(1)


def test_two_nodes_form_the_cluster_at_their_ips_and_serve_starts_with_ray_and_waits_for_both(
    stack: Pair,
) -> None:
    """serve starts with the head's Ray, not behind a health gate, and its placement group waits
    for the worker's GPU slot (the answer lists both nodes)."""
    bed, tmp = stack
    head, worker = bed.nodes[:2]
    config = write_config(tmp / "c.yaml", "pair", [head, worker])
    result = cli("up", config, cwd=tmp)
    assert result.returncode == 0, result.stderr
    assert "ready: http://192.168.200.12:30000/v1" in result.stdout

    answer = completion_from(worker, "http://192.168.200.12:30000/v1/completions", config)
    assert answer["ray_nodes"] == [head.ip, worker.ip]

    on_head, on_worker = containers(head, "pair"), containers(worker, "pair")
    assert set(on_head) == {"front-door", "ray", "serve"} and set(on_worker) == {"ray"}
    head_ray, serve, worker_ray = on_head["ray"], on_head["serve"], on_worker["ray"]
    started = serve.state.started_at, head_ray.state.started_at
    assert started[0] and started[1]
    assert started[1] < started[0] < first_healthy(worker_ray, 30)
    first_healthy(head_ray, 30)  # Ray's check runs every 15 s: status shows "starting" until then

    status = json.loads(cli("status", config, "--json", cwd=tmp).stdout)
    assert [(r["node"], r["ray_alive_at_ip"]) for r in status] == [
        ("spark1", True),
        ("spark2", True),
    ]
    assert {s["service"]: s["health"] for s in status[0]["services"]} == {
        "front-door": None,  # no check of its own: it is up when it runs
        "ray": "healthy",
        "serve": "healthy",
    }

    logs = cli("logs", config, "--node", "spark1", cwd=tmp).stdout.splitlines()
    assert any(
        line.startswith("spark1 | serve") and "stand-in vllm: attached to Ray" in line
        for line in logs
    )
    assert all(line.startswith("spark1 | ") for line in logs)


def test_a_worker_that_cannot_join_is_named_at_the_join_deadline(stack: Pair) -> None:
    bed, tmp = stack
    head, worker = bed.nodes[:2]
    config = write_config(tmp / "c.yaml", "nojoin", [head, worker])
    # Preflight names this fault first (test_preflight_testbed.py); here the join deadline must.
    bed.drop(head, worker.ip)
    try:
        began = time.monotonic()
        result = cli("up", config, "--join-timeout", "20", "--skip-preflight", cwd=tmp)
        took = time.monotonic() - began
    finally:
        bed.undrop(head, worker.ip)
    assert result.returncode == 1
    named = "failed: node 'spark2': phase 'ray-join' failed: not in Ray 20 s after the start: "
    assert f"{named}Ray nodes missing: 192.168.200.13 (alive: 192.168.200.12)" in result.stderr
    # What the worker waits for, from its log: the head's group port (image/group.py).
    assert "vllm-compose: waiting for the head at 192.168.200.12:29510" in result.stderr
    assert took < 20 + 60, f"took {took:.0f} s"
    assert containers(head, "nojoin") == {}  # rolled back
    said = cli("status", config, cwd=tmp).stdout.splitlines()
    assert said[1::2] == ["  no containers of c.yaml (vllm-compose up starts them)"] * 2, said


def test_a_front_door_that_cannot_start_fails_up_before_the_model_loads(stack: Pair) -> None:
    """Something else holds the endpoint's port on the head (preflight names that first:
    test_preflight_testbed.py; skipped here). HAProxy cannot bind and exits, again and again under
    its restart policy. `up` asks the door as a client would right after starting it, so it fails
    there, before Ray and serve start, with the door's own words."""
    bed, tmp = stack
    head, worker = bed.nodes[:2]
    config = write_config(tmp / "c.yaml", "shut", [head, worker])
    with bed.listening(head, 30000, images.STANDIN):
        result = cli("up", config, "--skip-preflight", cwd=tmp)
    assert result.returncode == 1
    named = "node 'spark1': phase 'front door' failed: the front door does not answer for "
    assert named in result.stderr, result.stderr
    assert "cannot bind socket" in result.stderr  # HAProxy's alert, from the door's log
    assert "ray ..." not in result.stderr and "front door: spark1: answers" not in result.stderr
    assert containers(head, "shut") == {}  # rolled back


def test_the_doors_on_a_clusters_nodes_route_to_each_other_and_one_beyond_them_is_named(
    stack: Pair,
) -> None:
    """A cluster headed on our worker: each door answers the other's model, at the other's door
    (its vLLM listens on that node's loopback alone). One whose door is on a node we are not on
    is behind neither door, nor we behind its; preflight and `up` say so, on the node we share,
    and its `up` keeps what the other doors there knew of ours."""
    bed, tmp = stack
    head, worker, third = bed.nodes[:3]
    shared = "gpu_memory_utilization: 0.1"

    def config(name: str, nodes: list[Node], port: int, served: str = "") -> Path:
        named = f"served_model_name: {served}, " if served else ""
        vllm = f"{{port: {port}, {named}{shared}}}"
        return clusters.write_config(tmp / f"{name}.yaml", name, nodes, images.STANDIN, vllm=vllm)

    away = config("away", [worker], 30001, "away")
    assert cli("up", away, cwd=tmp).returncode == 0
    ours = config("ours", [head, worker], 30000)
    checked = cli("preflight", ours, cwd=tmp)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "has its front door" not in checked.stdout, checked.stdout
    up = cli("up", ours, cwd=tmp)
    assert up.returncode == 0, up.stderr
    assert "front door: 2 model(s) behind the doors on spark1, spark2: " in up.stderr, up.stderr
    model = completion_from(head, f"http://{head.ip}:30000/v1/completions", ours)["model"]
    assert model != "away"
    assert answered_by(head, 30000, ours, "away") == "away"  # at away's door, on spark2
    assert answered_by(worker, 30001, away, model) == model  # at ours's, on spark1

    far = config("far", [third, worker], 30002, "far")  # its door on spark3
    assert cli("up", far, cwd=tmp).returncode == 0
    checked = cli("preflight", ours, cwd=tmp)
    said = [line for line in checked.stdout.splitlines() if "'far' has its front door" in line]
    assert len(said) == 1 and "spark2" in said[0], checked.stdout
    assert "on a node this cluster is not on: neither routes to the other's model" in said[0]
    assert answered_by(head, 30000, ours, "far") == "model_not_found"
    # far's `up` routed away's door to far, and kept away's route to ours.
    assert answered_by(worker, 30001, away, "far") == "far"
    assert answered_by(worker, 30001, away, model) == model


def answered_by(node: Node, port: int, config: Path, model: str) -> str:
    """The model that answered a completion asked for `model` at the door on `port` of `node`
    (from inside it, with the config's key); the error's code when none did."""
    auth = f"Authorization: Bearer {clusters.api_key(config)}"
    body = json.dumps({"model": model, "prompt": "hi", "max_tokens": 1})
    url = f"http://{node.ip}:{port}/v1/completions"
    answer = json.loads(node.nsexec("curl", "-s", "-m", "30", url, "-H", auth, "-d", body).stdout)
    return str(answer.get("model") or answer["error"]["code"])


def test_four_nodes_tp2_pp2_each_named_its_own_way_up_twice_changes_nothing_down_leaves_nothing(
    stack: Pair,
) -> None:
    """TP=2 x PP=2 over four nodes whose private-link interfaces all have other names (the
    Spark's twin ports, an eth, an ib). With `metrics`: Prometheus on the head scrapes every
    node's exporter and real Ray's metrics export port on every node (the image's Ray has its
    dashboard extra)."""
    bed, tmp = stack
    names = ["enp1s0f1np1", "enP2p1s0f1np1", "eth1", "ib0"]
    vllm = "{port: 30000, tensor_parallel_size: 2, pipeline_parallel_size: 2}"
    config = clusters.write_config(
        tmp / "c.yaml", "quad", bed.nodes, images.STANDIN, vllm=vllm, interfaces=names
    )
    with config.open("a") as f:
        f.write(clusters.METRICS.replace("}", ", ray_port: 8090}") + "\n")
    clusters.load_metrics(bed)
    with contextlib.ExitStack() as renamed:
        for node, name in zip(bed.nodes[1:], names[1:], strict=True):
            renamed.enter_context(bed.renamed_interface(node, name))
        first = cli("up", config, cwd=tmp)
        assert first.returncode == 0, first.stderr
        answer = completion_from(bed.nodes[3], "http://192.168.200.12:30000/v1/completions", config)
        assert answer["ray_nodes"] == sorted(n.ip for n in bed.nodes)
        nodes = sorted(n.name for n in bed.nodes)
        load = clusters.promql(bed.nodes[1], "node_load1", len(nodes))
        assert sorted(r["metric"]["node"] for r in load) == nodes
        query = 'count by (node) ({job="ray", __name__=~"ray_.+"})'
        ray = clusters.promql(bed.nodes[1], query, len(nodes))
        assert sorted(r["metric"]["node"] for r in ray) == nodes
        assert all(int(r["value"][1]) > 10 for r in ray), ray  # Ray's own series
        before = clusters.ids(bed.nodes, "quad")
        again = cli("up", config, cwd=tmp)
        assert again.returncode == 0, again.stderr
        after = clusters.ids(bed.nodes, "quad")
        assert after == before
        assert "image on spark4: present" in again.stdout

        down = cli("down", config, cwd=tmp)
    assert down.returncode == 0, down.stderr
    assert down.stdout.splitlines() == [f"{name}: removed" for name in nodes]
    for node in bed.nodes:
        assert clusters.leftovers(node, "quad") == []


def test_a_changed_config_recreates_only_what_changed(stack: Pair) -> None:
    bed, tmp = stack
    head, worker = bed.nodes[:2]
    config = write_config(tmp / "c.yaml", "change", [head, worker])
    assert cli("up", config, cwd=tmp).returncode == 0
    before = {s: c.id for s, c in containers(head, "change").items()}
    worker_before = containers(worker, "change")["ray"].id
    # A serve-only change (the API port would move every port of the cluster's slot, Ray's too).
    config.write_text(
        config.read_text().replace("{port: 30000}", "{port: 30000, args: [--seed, '1']}")
    )
    result = cli("up", config, cwd=tmp)
    assert result.returncode == 0, result.stderr
    after = {s: c.id for s, c in containers(head, "change").items()}
    assert after["serve"] != before["serve"]
    assert containers(worker, "change")["ray"].id == worker_before


@pytest.mark.parametrize("door", [True, False], ids=["front-door", "no-door"])
def test_a_rotated_api_key_is_applied_by_up(stack: Pair, door: bool) -> None:
    """A new key in the file, written onto the nodes by another command first (`secrets`): the
    next `up` applies it and the old key is refused from then on. Behind the front door, the door
    reads its keys again (up's one reload) and nothing restarts; without it, serve alone restarts
    with the key."""
    bed, tmp = stack
    head, worker = bed.nodes[:2]
    off = "" if door else "enabled: false"
    config = clusters.write_config(
        tmp / "c.yaml", "rotate", [head, worker], images.STANDIN, door=off
    )
    first = cli("up", config, cwd=tmp)
    assert first.returncode == 0, first.stderr
    url = "http://192.168.200.12:30000/v1/completions"
    old = clusters.api_key(config)
    before = {s: c.id for s, c in containers(head, "rotate").items()}
    key = tmp / "c.state" / "api-key"
    key.write_text("rotated-" + old[::-1])  # mode 0600 kept: the file is rewritten in place
    assert cli("secrets", config, cwd=tmp).returncode == 0
    again = cli("up", config, cwd=tmp)
    assert again.returncode == 0, again.stderr
    after = {s: c.id for s, c in containers(head, "rotate").items()}
    if door:
        assert "front door: spark1: answers on port 30000" in again.stderr  # with the new key
        assert "restarts" not in again.stderr and after == before
    else:
        said = "secrets: spark1: api_key changed since serve started; it restarts with it"
        assert said in again.stderr
        assert after["ray"] == before["ray"] and after["serve"] != before["serve"]
    assert completion_from(worker, url, config)["choices"]
    auth = f"Authorization: Bearer {old}"
    status = ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-d", "{}"]
    refused = worker.nsexec(*status, url, "-H", auth)
    assert refused.stdout == "401"


def test_external_default_route_needs_forced_node_ips(stack: Pair) -> None:
    """The field failure: the head's default route is an "external" address the workers cannot
    reach. The generated stack pins every node's IP and forms the cluster; the same stack without
    --node-ip-address on the head lets Ray register the external address, and the gate says so."""
    bed, tmp = stack
    head, worker = bed.nodes[:2]
    with bed.external_default_route(head):
        config = write_config(tmp / "c.yaml", "forced", [head, worker])
        forced = cli("up", config, cwd=tmp)
        assert forced.returncode == 0, forced.stderr
        cli("down", config, cwd=tmp)

        cli("render", config, "-o", tmp / "out", cwd=tmp)
        compose = tmp / "out/spark1/compose.yaml"
        pinned = '      - "--node-ip-address"\n      - "192.168.200.12"\n'
        assert pinned in compose.read_text()
        compose.write_text(compose.read_text().replace(pinned, "", 1))
        docker = DockerClient(
            context=head.context, compose_files=[compose], compose_project_name="forced"
        )
        docker.compose.up(["ray"], detach=True, quiet=True, pull="never")
        check = [
            "vllm-compose-health",
            "ray",
            "--address",
            "192.168.200.12:6379",
            "--expect",
            head.ip,
        ]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            probe = subprocess.run(
                ["docker", "--context", head.context, "exec", "forced-ray-1", *check],
                capture_output=True,
                text=True,
                check=False,
            )
            if "alive: 198.51.100.2" in probe.stderr:
                break
            time.sleep(2)
        assert probe.returncode == 1
        assert probe.stderr.strip() == (
            "vllm-compose-health: Ray nodes missing: 192.168.200.12 (alive: 198.51.100.2)"
        )
        docker.compose.down(volumes=True, quiet=True)


def test_deploy_over_real_ssh_contexts(stack: Pair) -> None:
    bed, tmp = stack
    head, worker = bed.nodes[:2]
    contexts = [bed.ssh_context(head), bed.ssh_context(worker)]
    config = write_config(tmp / "c.yaml", "overssh", [head, worker], contexts)
    result = cli("up", config, cwd=tmp)
    assert result.returncode == 0, result.stderr
    url = "http://192.168.200.12:30000/v1/completions"
    assert completion_from(worker, url, config)["ray_nodes"] == [
        head.ip,
        worker.ip,
    ]
    assert cli("down", config, cwd=tmp).returncode == 0
    assert containers(head, "overssh") == {}


def test_down_reports_an_unreachable_node_and_still_cleans_the_others(stack: Pair) -> None:
    bed, tmp = stack
    head, worker, third = bed.nodes[:3]
    config = write_config(tmp / "c.yaml", "partial", [head, worker, third])
    assert cli("up", config, cwd=tmp).returncode == 0
    bed.stop_engine(third)
    try:
        result = cli("down", config, cwd=tmp)
    finally:
        bed.start_engine(third)
    assert result.returncode == 1
    assert result.stdout.splitlines()[:2] == ["spark1: removed", "spark2: removed"]
    assert result.stdout.splitlines()[2].startswith("spark3: failed: ")
    assert containers(head, "partial") == {} and containers(worker, "partial") == {}


def test_ray_listens_on_every_address_but_answers_only_with_the_token(stack: Pair) -> None:
    """Ray 2.58 binds its GCS and node ports to every address, --node-ip-address or not. With an
    "external" address on the head: no dashboard and no client port on a wildcard address, only
    Ray's own processes (with its dashboard extra, also the head's two metrics servers, at the
    slot's ports) and the front door (keys checked) on wildcard addresses, and the GCS on the external
    address refuses a client without the cluster's token. Each node's metrics export stays off."""
    bed, tmp = stack
    head, worker = bed.nodes[:2]
    with bed.external_default_route(head):
        config = write_config(tmp / "c.yaml", "ports", [head, worker])
        result = cli("up", config, cwd=tmp)
        assert result.returncode == 0, result.stderr
        assert "ray token: generated" in result.stderr
        assert (tmp / "c.state" / "ray-token").stat().st_mode & 0o777 == 0o600
        for node in (head, worker):
            for address, port, process in listeners(node):
                assert port not in (8265, 10001), f"{node.name}: {process} on {address}:{port}"
                if address in (node.ip, "127.0.0.1"):
                    continue
                assert address in ("0.0.0.0", "*"), f"{node.name}: {process} on {address}:{port}"
                ray_own = process in ("gcs_server", "raylet") or process.startswith("ray::")
                ray_own |= node is head and port in (44217, 44227)  # Ray's metrics servers
                driver = node is head and process == "vllm"  # Ray's core worker in vLLM's driver
                door = node is head and process == "haproxy" and port == 30000  # keys checked
                assert ray_own or driver or door, f"{node.name}: {process} on {address}:{port}"
        gcs = ["vllm-compose-health", "nodes", "--address", "198.51.100.2:6379"]
        ray = containers(head, "ports")["ray"]
        with_token = head.docker.container.execute(ray, gcs)
        assert json.loads(str(with_token)) == {head.ip: 1, worker.ip: 1}
        without = subprocess.run(
            ["docker", "--context", head.context, "exec", "-e", "RAY_AUTH_MODE=disabled",
             ray.id, *gcs],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert without.returncode == 1
        assert "nauthenticated" in without.stderr or "uthentication" in without.stderr, without
        token = (tmp / "c.state" / "ray-token").read_text()
        for node in (head, worker):
            for service, container in containers(node, "ports").items():
                inspected = subprocess.run(
                    ["docker", "--context", node.context, "inspect", container.id],
                    capture_output=True, text=True, check=True,
                ).stdout  # fmt: skip
                assert token not in inspected, f"{node.name}/{service}: docker inspect"
                assert token not in node.docker.container.logs(container), f"{service}: logs"
                argv = str(node.docker.container.execute(container, ["ps", "-eo", "args"]))
                assert token not in argv, f"{node.name}/{service}: a command line"


def listeners(node: Node) -> list[tuple[str, int, str]]:
    """(address, port, process) of every TCP socket listening in the node."""
    found = []
    for line in node.nsexec("ss", "-ltnpH").stdout.splitlines():
        fields = line.split()
        address, port = fields[3].rsplit(":", 1)
        process = fields[5].split('"')[1] if len(fields) > 5 else "?"
        # gRPC's IPv6 sockets name an IPv4 address as ::ffff:A.B.C.D
        found.append((address.strip("[]").removeprefix("::ffff:"), int(port), process))
    return found
