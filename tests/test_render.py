from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from generator import config
from generator.stack import output, render

CASES = Path(__file__).parent / "cases"
# compose-lint (a test dependency) beside the Python running the tests: the venv's bin/, which
# `make test` does not put on PATH.
LINT = str(Path(sys.executable).parent / "compose-lint")
ROOT = Path(__file__).parent.parent
GOLDEN = Path(__file__).parent / "golden"
NAMES = ["sample", "four-node-pp", "native", "replicas"]
GROUP = ("ray", "serve")  # the services beside them (metrics') are tests/test_metrics.py's


def rendered(name: str) -> dict[str, render.File]:
    return render.render(config.load(CASES / f"{name}.yaml"), f"{name}.yaml")


def group(services: dict[str, Any]) -> dict[str, Any]:
    return {name: s for name, s in services.items() if name in GROUP}


def compose_files(files: dict[str, render.File]) -> dict[str, str]:
    return {rel: f.text for rel, f in files.items() if rel.endswith("compose.yaml")}


@pytest.mark.parametrize("name", NAMES)
def test_rendered_stacks_match_the_golden_files(name: str, update_golden: bool) -> None:
    for rel, text in compose_files(rendered(name)).items():
        golden = GOLDEN / name / rel
        if update_golden:
            golden.parent.mkdir(parents=True, exist_ok=True)
            golden.write_text(text)
        assert text == golden.read_text(), f"{golden} differs; rerun with --update-golden"


@pytest.mark.parametrize("name", NAMES)
def test_rendering_is_deterministic(name: str) -> None:
    assert rendered(name) == rendered(name)


def test_each_node_folder_holds_the_wrapper_build_context() -> None:
    files = rendered("sample")
    assert sorted(files) == [
        f"{node}/{name}"
        for node in ("spark-1", "spark-2")
        for name in (
            ".dockerignore",
            "Dockerfile",
            "compose.yaml",
            "contexts.env",
            "image/answers.py",
            "image/canary.py",
            "image/entrypoint.sh",
            "image/facts.py",
            "image/gpus.py",
            "image/group.py",
            "image/health.py",
            "image/raychecks.py",
            "image/stopping.py",
            "image/transfer.py",
        )
    ]
    assert files["spark-2/image/entrypoint.sh"].mode == 0o755
    assert files["spark-1/.dockerignore"].text.splitlines()[-1] == "secrets"
    assert files["spark-1/contexts.env"].text.splitlines()[-1] == (
        "VLLM_COMPOSE_SECRETS=/var/lib/vllm-compose/qwen35"
    )


def test_each_node_folder_carries_the_secrets_its_stack_uses_and_nowhere_else() -> None:
    cluster = config.load(CASES / "sample.yaml")
    keys = "0f1e hash-of-K-123 admin\n"  # the front door's: hashes, never keys
    given = {"api_key": "K-123", "ray_token": "T-456", "front_door_keys": keys}
    given["front_door_routes"] = "/models/m 8400\n"  # made beside the config (nodes/secrets.py)
    given["front_door_models"] = '{"object": "list", "data": []}\n'
    given["front_door_peer_key"] = "door D-789\n"  # its key at the other doors
    given["front_door_peers"] = "0e1f hash-of-D-789 door:sample\n"
    files = render.render(cluster, "sample.yaml", given)
    secret = {rel: f for rel, f in files.items() if f.secret}
    assert sorted(secret) == [
        "spark-1/secrets/.gitignore",
        "spark-1/secrets/api-key",
        "spark-1/secrets/front-door-keys",  # the head's front door
        "spark-1/secrets/front-door-models.json",
        "spark-1/secrets/front-door-peer-key",
        "spark-1/secrets/front-door-peers",
        "spark-1/secrets/front-door-routes",
        "spark-1/secrets/ray-token",
        "spark-2/secrets/.gitignore",
        "spark-2/secrets/ray-token",  # a Ray worker: Ray's token, not the API key
    ]
    assert {f.mode for f in secret.values()} == {0o600}
    assert files["spark-1/secrets/api-key"].text == "K-123"
    assert files["spark-1/secrets/.gitignore"].text.splitlines()[-1] == "*"
    public = [f.text for f in files.values() if not f.secret]
    assert not [t for t in public if "K-123" in t or "T-456" in t or "D-789" in t]
    head = yaml.safe_load(files["spark-1/compose.yaml"].text)
    assert head["secrets"] == {
        "api_key": {"file": "${VLLM_COMPOSE_SECRETS:-./secrets}/api-key"},
        "ray_token": {"file": "${VLLM_COMPOSE_SECRETS:-./secrets}/ray-token"},
        "front_door_keys": {"file": "${VLLM_COMPOSE_SECRETS:-./secrets}/front-door-keys"},
        "front_door_routes": {"file": "${VLLM_COMPOSE_SECRETS:-./secrets}/front-door-routes"},
        "front_door_models": {"file": "${VLLM_COMPOSE_SECRETS:-./secrets}/front-door-models.json"},
        "front_door_peer_key": {"file": "${VLLM_COMPOSE_SECRETS:-./secrets}/front-door-peer-key"},
        "front_door_peers": {"file": "${VLLM_COMPOSE_SECRETS:-./secrets}/front-door-peers"},
    }


@pytest.mark.parametrize("name", ["sample", "native", "four-node-pp"])
def test_only_the_front_door_mounts_its_files(name: str) -> None:
    """Its keys' map, routes, model list, door key and peers are the door's alone: serve (head or worker) mounts
    none, so the worker's folder does not need them and a change to them restarts nothing."""
    cluster = config.load(CASES / f"{name}.yaml")
    files = render.render(cluster, f"{name}.yaml", {"api_key": "K-123", "ray_token": "T-456"})
    stacks = [yaml.safe_load(f.text) for rel, f in files.items() if rel.endswith("compose.yaml")]
    mounted = {
        (service, secret)
        for stack in stacks
        for service, spec in stack["services"].items()
        for secret in spec.get("secrets", [])
        if secret.startswith("front_door")
    }
    door = {"front_door_keys", "front_door_routes", "front_door_models", "front_door_peer_key"}
    door.add("front_door_peers")
    assert mounted == {("front-door", secret) for secret in door}


def test_a_dry_run_never_shows_a_secret(tmp_path: Path) -> None:
    cluster = config.load(CASES / "sample.yaml")
    files = render.render(cluster, "sample.yaml", {"api_key": "K-123", "ray_token": "T-456"})
    changes = output.plan(files, tmp_path)
    assert all("K-123" not in c.diff() and "T-456" not in c.diff() for c in changes)
    output.apply(changes)
    assert (tmp_path / "spark-1/secrets").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "spark-1/secrets/api-key").stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("name", ["sample", "four-node-pp"])
def test_ray_stacks_keep_per_node_variables_on_their_node(name: str) -> None:
    """vLLM's Ray executor copies the driver's NCCL_*/VLLM_* variables to every worker unless
    ray_non_carry_over_env_vars.json under VLLM_CONFIG_ROOT lists them: every Ray service gets
    that list, with every variable that differs per node."""
    cluster = config.load(CASES / f"{name}.yaml")
    for rel, text in compose_files(render.render(cluster, "c.yaml")).items():
        stack = yaml.safe_load(text)
        listed = json.loads(stack["configs"]["vllm-ray-env"]["content"])
        assert listed == ["VLLM_HOST_IP", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_HCA"]
        for service in group(stack["services"]).values():
            assert service["configs"] == [
                {
                    "source": "vllm-ray-env",
                    "target": "/etc/vllm-compose/vllm/ray_non_carry_over_env_vars.json",
                }
            ], rel
            assert service["environment"]["VLLM_CONFIG_ROOT"] == "/etc/vllm-compose/vllm"


def test_serve_shares_the_head_rays_temp_folder() -> None:
    """vLLM's driver (serve) and its rank-0 Ray worker (in the Ray container) meet on ZMQ ipc://
    sockets under the temp folder, and vLLM's file:// init method lives there too."""
    stack = yaml.safe_load(rendered("sample")["spark-1/compose.yaml"].text)
    for service in ("ray", "serve"):
        assert "shared-tmp:/tmp" in stack["services"][service]["volumes"]
    assert stack["services"]["serve"]["pid"] == "service:ray"
    assert set(stack["volumes"]) == {"shared-tmp", stack["services"]["serve"]["volumes"][-1][:26]}


def test_every_service_keeps_its_compile_caches_in_a_volume_named_by_image_and_model() -> None:
    cluster = config.load(CASES / "sample.yaml")
    stacks = render.node_stacks(cluster, "sample.yaml")
    names = {stack.cache_volume for stack in stacks}
    assert len(names) == 1  # one name; each node's engine keeps its own volume of that name
    for stack in stacks:
        for service in stack.services:
            assert f"{stack.cache_volume}:/var/cache/vllm-compose" in service.volumes
            assert service.environment["VLLM_CACHE_ROOT"] == "/var/cache/vllm-compose/vllm"
    other_image = cluster.model_copy(update={"image": "vllm/vllm-openai:v0.11.0"})
    other_model = cluster.model_copy(
        update={"model": cluster.model.model_copy(update={"path": "/models/other"})}
    )
    for changed in (other_image, other_model):
        assert render.node_stacks(changed, "sample.yaml")[0].cache_volume not in names
    # Locking pins the image to its ID (upgrade re-locks): the same image keeps its caches.
    locked = cluster.pinned_to("sha256:" + "ab" * 32)
    assert render.node_stacks(locked, "sample.yaml")[0].image != stacks[0].image
    assert render.node_stacks(locked, "sample.yaml")[0].cache_volume in names


def compose_config(folder: Path) -> dict[str, Any]:
    """`docker compose config` (needs no engine): validates and normalises the file."""
    result = subprocess.run(
        ["docker", "compose", "config", "--format", "json"],
        cwd=folder,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout))


@pytest.mark.parametrize("name", NAMES)
def test_docker_compose_accepts_every_rendered_file(name: str, tmp_path: Path) -> None:
    files = rendered(name)
    output.apply(output.plan(files, tmp_path))
    cluster = config.load(CASES / f"{name}.yaml")
    for node in cluster.nodes:
        normalised = compose_config(tmp_path / node.name)
        assert normalised["name"] == cluster.name
        for service in group(normalised["services"]).values():
            assert service["network_mode"] == "host"
            assert service.get("privileged") is not True
            assert service["environment"]["VLLM_HOST_IP"] == str(node.ip)
            assert service["environment"]["NCCL_SOCKET_IFNAME"] == cluster.interface_of(node)
            assert service["environment"]["GLOO_SOCKET_IFNAME"] == cluster.interface_of(node)
            assert len(service["labels"]["io.vllm-compose.config-hash"]) == 64
        assert normalised["x-vllm-compose"]["config-hash"] == cluster.config_hash()


def test_ray_stack_orders_and_addresses_every_node(tmp_path: Path) -> None:
    output.apply(output.plan(rendered("four-node-pp"), tmp_path))
    head = group(compose_config(tmp_path / "node-b")["services"])
    assert set(head) == {"ray", "serve"}
    assert head["ray"]["command"][:5] == [
        "ray",
        "start",
        "--block",
        "--node-ip-address",
        "10.10.0.2",
    ]
    # serve starts with the head's Ray (vLLM's Ray client retries until the GCS answers, then
    # vLLM waits for every node's GPU slot): a gate on Ray's healthcheck held vLLM back 5-10 s.
    assert head["serve"]["depends_on"]["ray"]["condition"] == "service_started"
    assert head["serve"]["command"][:12] == [
        "vllm",
        "serve",
        "/srv/models/Llama-3.1-405B-FP8",
        "--tensor-parallel-size",
        "2",
        "--pipeline-parallel-size",
        "2",
        "--gpu-memory-utilization",
        "0.85",
        "--port",
        "8400",  # behind the front door, which takes 8000
        "--host",
    ]
    assert "--expect" in head["ray"]["healthcheck"]["test"]
    expected = "10.10.0.1,10.10.0.2,10.10.0.3,10.10.0.4"
    assert head["ray"]["healthcheck"]["test"][-3:] == [expected, "--gpus", "4"]
    for worker, ip in (("node-a", "10.10.0.1"), ("node-c", "10.10.0.3"), ("node-d", "10.10.0.4")):
        services = group(compose_config(tmp_path / worker)["services"])
        assert list(services) == ["ray"]
        command = services["ray"]["command"]
        assert command[command.index("--address") + 1] == "10.10.0.2:6380"
        assert command[command.index("--node-ip-address") + 1] == ip


def test_dgx_spark_profile_adds_rdma_without_privileged(tmp_path: Path) -> None:
    output.apply(output.plan(rendered("four-node-pp"), tmp_path))
    ray = compose_config(tmp_path / "node-a")["services"]["ray"]
    assert ray["cap_add"] == ["IPC_LOCK"]
    assert ray["devices"][0]["source"] == "/dev/infiniband"
    assert ray["ulimits"]["memlock"] == -1
    assert ray["ipc"] == "host"
    assert "--object-store-memory" in ray["command"]


def test_native_stack_has_rank_zero_with_api_and_headless_workers(tmp_path: Path) -> None:
    output.apply(output.plan(rendered("native"), tmp_path))
    head = compose_config(tmp_path / "spark-1")["services"]["serve"]["command"]
    worker = compose_config(tmp_path / "spark-2")["services"]["serve"]["command"]
    assert head[-9:] == [
        "--nnodes",
        "2",
        "--node-rank",
        "0",
        "--master-addr",
        "192.168.200.12",
        "--master-port",
        "29600",
        "--enforce-eager",
    ]
    assert head[head.index("--node-rank") + 1] == "0"
    assert "--headless" not in head
    assert worker[worker.index("--node-rank") + 1] == "1"
    assert worker[worker.index("--master-addr") + 1] == "192.168.200.12"
    assert "--headless" in worker
    assert "ray" not in head and "--distributed-executor-backend" not in head


HOSTILE = [
    "$(touch /tmp/pwned)",
    "${HOME}",
    "$HOME",
    'it\'s "quoted"',
    "a: #b",
    "line1\nline2: injected",
    "- list",
    "{flow: map}",
    "`id`; rm -rf /",
    "\ttab",
    "ünïcødé",
]


def test_hostile_values_render_literally(tmp_path: Path) -> None:
    text = (CASES / "sample.yaml").read_text()
    cluster = config.parse(text).model_copy(
        update={
            "vllm": config.parse(text).vllm.model_copy(update={"args": HOSTILE}),
            "env": {f"V{i}": v for i, v in enumerate(HOSTILE)},
        }
    )
    files = render.render(cluster, "sample.yaml")
    output.apply(output.plan(files, tmp_path))
    # `docker compose config` prints values in its own escaped form: `$` stays `$$`, which proves
    # nothing was interpolated (`${HOME}` would have become a path). The engine test checks that
    # a running container receives the plain string (test_corpus.py).
    escaped = [v.replace("$", "$$") for v in HOSTILE]
    for node, keys in (
        ("spark-1", {"name", "x-vllm-compose", "services", "volumes", "secrets", "configs"}),
        ("spark-2", {"name", "x-vllm-compose", "services", "volumes", "secrets", "configs"}),
    ):
        parsed = yaml.safe_load((tmp_path / node / "compose.yaml").read_text())
        assert set(parsed) == keys
        normalised = compose_config(tmp_path / node)
        for name, service in parsed["services"].items():
            if "environment" not in service:
                continue  # the front door: none of the config's environment
            assert [
                parsed["services"][name]["environment"][f"V{i}"] for i in range(len(HOSTILE))
            ] == escaped
            env = normalised["services"][name]["environment"]
            assert [env[f"V{i}"] for i in range(len(HOSTILE))] == escaped
    serve = compose_config(tmp_path / "spark-1")["services"]["serve"]
    assert serve["command"][-len(HOSTILE) :] == escaped


def test_an_hf_cache_snapshot_mounts_its_repo_folder_where_the_symlinks_point() -> None:
    text = (CASES / "sample.yaml").read_text()
    snapshot = "/hf/hub/models--Qwen--Qwen3.5-122B-A10B-FP8/snapshots/0123abcd"
    cluster = config.parse(text.replace("/models/Qwen3.5-122B-A10B-FP8", snapshot))
    stack = yaml.safe_load(render.render(cluster, "c.yaml")["spark-1/compose.yaml"].text)
    bind = stack["services"]["serve"]["volumes"][0]
    assert bind["source"] == bind["target"] == "/hf/hub/models--Qwen--Qwen3.5-122B-A10B-FP8"
    assert bind["read_only"] is True and bind["bind"] == {"create_host_path": False}
    assert stack["services"]["serve"]["command"][2] == snapshot


@pytest.mark.parametrize("name", ["sample", "four-node-pp", "native"])
def test_compose_lint_finds_nothing_that_is_not_justified(name: str, tmp_path: Path) -> None:
    """compose-lint on every node's stack, down to low severity, with the project's suppressions
    (.compose-lint.yml, each with its reason, mirrored in docs/security.md)."""
    output.apply(output.plan(rendered(name), tmp_path))
    files = sorted(str(p) for p in tmp_path.glob("*/compose.yaml"))
    result = subprocess.run(
        [
            LINT, "check", "--config", str(ROOT / ".compose-lint.yml"),
            "--strict-config", "--fail-on", "low", "--format", "json", *files,
        ],
        capture_output=True,
        text=True,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    values=st.lists(
        st.text(
            st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"), max_size=40
        ),
        min_size=1,
        max_size=4,
    )
)
def test_any_accepted_value_renders_a_file_compose_reads_back_exactly(
    values: list[str], tmp_path: Path
) -> None:
    """Every string the schema accepts for env and args, through the renderer and `docker compose
    config`, comes back as written (`$` doubled: Compose's own escape)."""
    text = (CASES / "native.yaml").read_text()
    cluster = config.parse(text)
    cluster = cluster.model_copy(
        update={
            "env": {f"V{i}": v for i, v in enumerate(values)},
            "vllm": cluster.vllm.model_copy(update={"args": values}),
        }
    )
    folder = tmp_path / str(abs(hash(tuple(values))))
    output.apply(output.plan(render.render(cluster, "native.yaml"), folder))
    service = compose_config(folder / "spark-1")["services"]["serve"]
    escaped = [v.replace("$", "$$") for v in values]
    assert [service["environment"][f"V{i}"] for i in range(len(values))] == escaped
    assert service["command"][-len(values) :] == escaped


def test_replicas_render_one_folder_a_node_each_the_first_with_the_door() -> None:
    """The second replica's folder runs its own vLLM with the API key, on `vllm.port`; the
    first's door names it (started by hand in tests/test_by_hand.py)."""
    files = render.render(config.load(CASES / "replicas.yaml"), "replicas.yaml", {"api_key": "k"})
    assert "secrets/api-key" in "".join(f for f in files if f.startswith("spark-3/"))
    door = files["spark-1/compose.yaml"].text
    assert "server vllm 192.168.200.14:30000" in door and "replica-2" in door
    assert "--host" not in files["spark-3/compose.yaml"].text
