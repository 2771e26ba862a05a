from __future__ import annotations

from pathlib import Path

import pytest

from generator import config
from generator.base.errors import ConfigError

CASES = Path(__file__).parent / "cases"

BASE = """\
name: c
image: vllm/vllm-openai:v0.32.0
interface: eth0
nodes:
  - {name: a, ip: 10.0.0.1}
  - {name: b, ip: 10.0.0.2}
model: {path: /models/m}
"""


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        config.parse(text)
    return caught.value.problems


def test_the_readme_sample_validates_as_written() -> None:
    cluster = config.load(CASES / "sample.yaml")
    assert cluster.head.name == "spark-1"
    assert [n.docker_context for n in cluster.nodes] == ["spark-1", "spark-2"]
    assert cluster.tensor_parallel_size == 2
    assert cluster.vllm.args[-1] == "--enable-auto-tool-choice"


def test_defaults_first_node_is_head_context_is_name_one_gpu_each() -> None:
    cluster = config.parse(BASE)
    assert cluster.head.name == "a"
    assert [w.name for w in cluster.workers] == ["b"]
    assert cluster.nodes[1].docker_context == "b"
    assert cluster.gpu_total == 2
    assert cluster.tensor_parallel_size == 2
    assert cluster.backend == "ray"


def test_role_head_moves_the_head_and_node_interface_overrides() -> None:
    text = BASE.replace(
        "{name: b, ip: 10.0.0.2}", "{name: b, ip: 10.0.0.2, role: head, interface: ib0}"
    )
    cluster = config.parse(text)
    assert cluster.head.name == "b"
    assert cluster.interface_of(cluster.nodes[1]) == "ib0"
    assert cluster.interface_of(cluster.nodes[0]) == "eth0"


def test_tensor_parallel_defaults_to_gpus_over_pipeline_stages() -> None:
    three_and_one = BASE.replace("ip: 10.0.0.1}", "ip: 10.0.0.1, gpus: 3}")
    cluster = config.parse(three_and_one + "vllm: {pipeline_parallel_size: 2}")
    assert cluster.tensor_parallel_size == 2


def test_config_hash_changes_with_any_value() -> None:
    assert (
        config.parse(BASE).config_hash()
        != config.parse(BASE.replace("/models/m", "/models/n")).config_hash()
    )
    assert config.parse(BASE).config_hash() == config.parse(BASE).config_hash()


FOUR = BASE.replace(
    "  - {name: b, ip: 10.0.0.2}\n",
    "  - {name: b, ip: 10.0.0.2}\n  - {name: c, ip: 10.0.0.3}\n  - {name: d, ip: 10.0.0.4}\n",
)


def test_replicas_share_the_nodes_out_in_order_each_share_a_group_of_its_own() -> None:
    cluster = config.parse(FOUR + "replicas: 2\n")
    first, second = cluster.groups
    assert [n.name for n in first.nodes] == ["a", "b"] and first.head.name == "a"
    assert [n.name for n in second.nodes] == ["c", "d"] and second.head.name == "c"
    assert [n.name for n in second.workers] == ["d"]
    assert cluster.tensor_parallel_size == first.tensor_parallel_size == 2  # one share's GPUs
    assert first.front_door.enabled and not second.front_door.enabled  # the first's door
    assert [n.name for n in second.replica_heads] == ["a", "c"] and second.replica == 1
    assert first.config_hash() == second.config_hash() == cluster.config_hash()
    assert config.parse(FOUR).groups == [config.parse(FOUR)]


def test_a_lock_made_before_replicas_still_matches_a_config_that_does_not_set_them() -> None:
    explicit = FOUR + "replicas: 1\nfront_door: {balance: leastconn}\n"
    assert config.parse(explicit).config_hash() == config.parse(FOUR).config_hash()
    assert config.parse(FOUR + "replicas: 2\n").config_hash() != config.parse(FOUR).config_hash()


def test_overriding_the_memory_monitor_is_allowed_with_a_warning() -> None:
    cluster = config.parse(BASE + "env: {RAY_memory_monitor_refresh_ms: '250'}")
    assert config.warnings(cluster) == [
        "env.RAY_memory_monitor_refresh_ms: overriding the default 0 re-enables Ray's memory"
        " monitor, which kills workers during weight loading on unified-memory GPUs"
    ]
    assert config.warnings(config.parse(BASE)) == []


def test_ray_token_auth_turned_off_is_allowed_with_a_warning() -> None:
    cluster = config.parse(BASE + "ray: {token_auth: false}")
    assert config.warnings(cluster) == [
        "ray.token_auth: off; Ray's GCS and node ports listen on every address of every node and"
        " run whatever anyone who reaches them sends"
    ]


@pytest.mark.parametrize(
    "image",
    [
        "nvcr.io/nvidia/vllm:25.09-PY3",  # a tag may hold upper case
        "localhost:5000/team/vllm:Nightly_2026",
        "hellohal2064/vllm-qwen3.5-gb10:latest",
        "vllm/vllm-openai@sha256:" + "ab" * 32,
    ],
)
def test_legal_image_references_are_accepted(image: str) -> None:
    assert config.parse(BASE.replace("vllm/vllm-openai:v0.32.0", image)).image == image


BROKEN = [
    ("name: [", ["line 1, column 8: expected the node content, but found '<stream end>'"]),
    ("- a\n- b\n", ["the file must hold a mapping (name: ..., nodes: ...)"]),
    (BASE + "name: d\n", ["line 8, column 1: duplicate key 'name'"]),
    (
        BASE + "colour: red\n",
        [
            "colour: unknown key (known: name, image, backend, profile, accelerator, interface,"
            " nodes, replicas, model, vllm, ray, group, canary, gpu_temperature_limit, env, front_door,"
            " metrics, secrets)"
        ],
    ),
    (
        BASE.replace("ip: 10.0.0.2}", "ip: 10.0.0.2, ipp: 1}"),
        ["nodes.1.ipp: unknown key (known: name, ip, context, interface, gpus, role)"],
    ),
    (
        BASE + "vllm: {tp: 2}\n",
        [
            "vllm.tp: unknown key (known: port, tensor_parallel_size, pipeline_parallel_size,"
            " gpu_memory_utilization, max_model_len, served_model_name, safetensors_load_strategy,"
            " master_port, startup_timeout, args)"
        ],
    ),
    (
        BASE.replace("name: c", "name: My Cluster"),
        [
            "name: 'My Cluster' is not allowed: use 1-63 lowercase letters, digits, '-' or '_',"
            " starting with a letter or digit"
        ],
    ),
    (
        BASE.replace("name: a,", "name: ../etc,"),
        [
            "nodes.0.name: '../etc' is not allowed: use 1-63 lowercase letters, digits, '-' or '_',"
            " starting with a letter or digit"
        ],
    ),
    (BASE.replace("10.0.0.2", "10.0.0.300"), ["nodes.1.ip: Input is not a valid IPv4 address"]),
    (BASE.replace("10.0.0.2", "10.0.0.1"), ["nodes.1.ip: 10.0.0.1 is already used by node 'a'"]),
    (
        BASE.replace("name: b,", "name: a,"),
        [
            "nodes.1.name: a is already used by node 'a'",
            "nodes.1.context: a is already used by node 'a'",
        ],
    ),
    (
        BASE.replace("ip: 10.0.0.2}", "ip: 10.0.0.2, context: a}"),
        ["nodes.1.context: a is already used by node 'a'"],
    ),
    (
        BASE.replace("nodes:", "nodes: []\nx:").replace(
            "x:\n  - {name: a, ip: 10.0.0.1}\n  - {name: b, ip: 10.0.0.2}\n", ""
        ),
        ["nodes: List should have at least 1 item after validation, not 0"],
    ),
    (
        BASE.replace("ip: 10.0.0.1}", "ip: 10.0.0.1, role: head}").replace(
            "ip: 10.0.0.2}", "ip: 10.0.0.2, role: head}"
        ),
        ["nodes.1.role: a second head; only one node may say 'role: head'"],
    ),
    (
        BASE.replace("ip: 10.0.0.1}", "ip: 10.0.0.1, role: boss}"),
        ["nodes.0.role: Input should be 'head' or 'worker'"],
    ),
    (
        BASE.replace("interface: eth0\n", ""),
        [
            "nodes.0.interface: no interface for node 'a'; set `interface` at the top level or on the node",
            "nodes.1.interface: no interface for node 'b'; set `interface` at the top level or on the node",
        ],
    ),
    (
        BASE.replace("interface: eth0", "interface: a-very-long-interface-name"),
        [
            "interface: 'a-very-long-interface-name' is not allowed: an interface name has 1-15"
            " letters, digits, '_', '.', ':' or '-'"
        ],
    ),
    (
        BASE + "vllm: {tensor_parallel_size: 4}\n",
        ["vllm.tensor_parallel_size: TP 4 x PP 1 = 4 GPUs asked for, the nodes have 2"],
    ),
    (
        BASE + "vllm: {tensor_parallel_size: 2, pipeline_parallel_size: 2}\n",
        ["vllm.tensor_parallel_size: TP 2 x PP 2 = 4 GPUs asked for, the nodes have 2"],
    ),
    (
        FOUR + "replicas: 3\n",
        [
            "replicas: 3 groups do not divide 4 nodes; give each replica as many nodes (each"
            " share's first node is its head)"
        ],
    ),
    (
        FOUR.replace("ip: 10.0.0.3}", "ip: 10.0.0.3, role: worker}")
        + "replicas: 2\nfront_door: {enabled: false}\n",
        [
            "nodes.2.role: with replicas each share's first node is its head; leave `role` out",
            "front_door.enabled: the front door balances the replicas; turn it on, or set"
            " replicas: 1",
        ],
    ),
    (
        FOUR.replace("ip: 10.0.0.1}", "ip: 10.0.0.1, gpus: 2}")
        + "replicas: 2\nvllm: {tensor_parallel_size: 3}\n",
        ["vllm.tensor_parallel_size: TP 3 x PP 1 = 3 GPUs asked for, replica 2's nodes have 2"],
    ),
    (
        BASE.replace("ip: 10.0.0.1}", "ip: 10.0.0.1, gpus: 0}"),
        ["nodes.0.gpus: Input should be greater than or equal to 1"],
    ),
    (
        BASE.replace("ip: 10.0.0.1}", "ip: 10.0.0.1, gpus: '2'}"),
        ["nodes.0.gpus: Input should be a valid integer"],
    ),
    (
        BASE + "vllm: {gpu_memory_utilization: 1.5}\n",
        ["vllm.gpu_memory_utilization: Input should be less than or equal to 1"],
    ),
    (BASE + "vllm: {port: 70000}\n", ["vllm.port: Input should be less than or equal to 65535"]),
    (
        BASE + "vllm: {args: [--tensor-parallel-size, '2']}\n",
        [
            "vllm.args.0: --tensor-parallel-size has a named field (tensor_parallel_size); set it there"
        ],
    ),
    (
        BASE + "vllm: {args: ['--port=9000']}\n",
        ["vllm.args.0: --port has a named field (port); set it there"],
    ),
    (
        BASE + "vllm: {args: [--max-num-seqs, 8]}\n",
        ["vllm.args.1: expected a string, got 8; quote it in the YAML"],
    ),
    (
        BASE + "env: {VLLM_HOST_IP: 10.0.0.9}\n",
        [
            "env.VLLM_HOST_IP: set per node by vllm-compose from nodes[].ip / interface; remove it here"
        ],
    ),
    (
        BASE + "env: {'BAD KEY': x}\n",
        [
            "env.BAD KEY.[key]: 'BAD KEY' is not allowed: a variable name has letters, digits and '_',"
            " not starting with a digit"
        ],
    ),
    (
        BASE.replace("/models/m", "models/m"),
        [
            "model.path: 'models/m' is not allowed: expected an absolute path without ':' or control"
            " characters"
        ],
    ),
    (
        BASE.replace("vllm/vllm-openai:v0.32.0", "'vllm openai'"),
        [
            "image: 'vllm openai' is not allowed: expected an image reference like registry/name:tag"
            " or name@sha256:<digest>"
        ],
    ),
    (BASE + "backend: mpi\n", ["backend: Input should be 'ray' or 'native'"]),
    (BASE + "profile: dgx\n", ["profile: Input should be 'generic' or 'dgx-spark'"]),
    (BASE.replace("model: {path: /models/m}\n", ""), ["model: Field required"]),
]


@pytest.mark.parametrize(("text", "expected"), BROKEN, ids=[str(i) for i in range(len(BROKEN))])
def test_broken_config_is_rejected_with_one_line_per_problem(
    text: str, expected: list[str]
) -> None:
    assert problems(text) == expected


def test_unreadable_file_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        config.load(tmp_path / "missing.yaml")
    assert caught.value.message == f"{tmp_path / 'missing.yaml'} is invalid:"
    assert caught.value.problems[0].startswith(
        "cannot read it: [Errno 2] No such file or directory"
    )


def test_trust_remote_code_is_warned_of_however_it_is_spelled() -> None:
    text = (CASES / "sample.yaml").read_text()
    for spelling in ("--trust-remote-code", "--trust_remote_code", "--trust-remote"):
        c = config.parse(
            text.replace("--enable-auto-tool-choice]", f"--enable-auto-tool-choice, {spelling}]")
        )
        assert config.warnings(c) == [
            "vllm.args: --trust-remote-code runs code from the model repository"
        ], spelling
