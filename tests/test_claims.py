"""Several clusters on the same nodes: every port follows the API port's slot, the claims each
stack labels its containers with, and the clashes preflight names (our logic alone: the two real
clusters are in tests/test_side_by_side.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from generator import config
from generator.config import ports
from generator.stack import NodeStack, claims, slots
from generator.stack.claims import Claim

BASE = """\
name: {name}
image: vllm/vllm-openai:v0.32.0
backend: {backend}
interface: eth0
nodes:
  - {{name: a, ip: 10.0.0.1}}
  - {{name: b, ip: 10.0.0.2}}
model: {{path: /models/m}}
vllm: {{port: {port}, gpu_memory_utilization: {memory}}}
"""


def cluster(name: str, port: int, backend: str = "ray", memory: float = 0.4) -> config.Cluster:
    return config.parse(BASE.format(name=name, port=port, backend=backend, memory=memory))


def claim_of(c: config.Cluster, service: str = "serve") -> Claim:
    """The claim as `claims.found` reads it back from one of its containers' labels."""

    stack = NodeStack(c, c.head, "c.yaml", "wrapper:1")
    labels = {**stack.labels, "io.vllm-compose.service": service}
    state = SimpleNamespace(running=True, status="running", exit_code=0, health=None)
    container = SimpleNamespace(name="x", config=SimpleNamespace(labels=labels), state=state)
    return claims.found({"a": [container]})[c.name]  # type: ignore[list-item]


def test_slot_zero_keeps_the_usual_ports_and_another_api_port_moves_every_other_one() -> None:
    first, second = cluster("one", 8000), cluster("two", 8001)
    assert (ports.ray_gcs(first), ports.group(first), ports.master(first)) == (6379, 29510, 29501)
    assert (ports.ray_gcs(second), ports.group(second), ports.master(second)) == (
        6380,
        29511,
        29500,
    )
    a, b = ports.ranges(first), ports.ranges(second)
    assert all(not set(x) & set(y) for x in a.values() for y in b.values())


@pytest.mark.parametrize("backend", ["ray", "native"])
def test_every_slot_is_clear_of_every_other_slot_and_of_preflights_ports(backend: str) -> None:
    spans = [ports.ranges(cluster("c", 30000 + k, backend)) for k in range(ports.SLOTS)]
    taken: dict[int, int] = {}
    for k, found in enumerate(spans):
        for span in found.values():
            for port in span:
                if port != 30000 + k:  # the API ports themselves: a user's choice
                    assert taken.setdefault(port, k) == k, (port, k, taken[port])
                    assert not 20000 <= port < 29000 and not 29700 <= port < 30000


def test_ray_is_given_every_port_of_its_slot() -> None:
    c = cluster("two", 8001)
    head, worker = (NodeStack(c, n, "c.yaml", "w:1").services[0] for n in c.nodes)
    assert head.command[head.command.index("--port") + 1] == "6380"
    for option, port in [("--node-manager-port", 6501), ("--min-worker-port", 10101)]:
        assert worker.command[worker.command.index(option) + 1] == str(port)
    assert head.command[head.command.index("--ray-client-server-port") + 1] == "6901"
    assert "--ray-client-server-port" not in worker.command


def test_two_clusters_on_their_own_ports_and_within_memory_do_not_clash() -> None:
    assert claims.clashes(cluster("two", 8001), "a", [claim_of(cluster("one", 8000))], 2**33) == []


def test_the_same_api_port_is_named_with_the_other_cluster() -> None:
    found = claims.clashes(cluster("two", 8000), "a", [claim_of(cluster("one", 8000))], 2**33)
    assert "vllm.port 8000 is taken by cluster 'one' (vllm.port)" in found
    assert "ray.port 6379 is taken by cluster 'one' (ray.port)" in found


def test_a_model_another_front_door_on_the_nodes_routes_to_is_named() -> None:
    door = claim_of(cluster("one", 8000), "front-door")
    assert (door.model, door.front_door) == ("/models/m", True)
    assert door.route == ("/models/m", 8400)
    assert door.door == ("10.0.0.1", 8000)  # its endpoint: where another node's door asks it
    said = (
        "model '/models/m' is served by cluster 'one' behind its front door here, and the doors"
        " on these nodes route by it: set vllm.served_model_name"
    )
    for node in ("a", "b"):  # on our head or on our worker: the doors route to each other
        assert claims.clashes(cluster("two", 8001, memory=0.1), node, [door], 2**33) == [said]
    two = cluster("two", 8001, memory=0.1)
    named = two.model_copy(update={"vllm": two.vllm.model_copy(update={"served_model_name": "t"})})
    assert claims.clashes(named, "a", [door], 2**33) == []


def test_memory_over_the_nodes_is_named_with_every_cluster_sharing_it() -> None:
    others = [claim_of(cluster("one", 8000)), claim_of(cluster("two", 8001))]
    found = claims.clashes(cluster("three", 8002, memory=0.3), "a", others, 2**33)
    assert found == [
        "GPU memory overflows: 0.3 of 'three' + 0.4 of 'one' + 0.4 of 'two' = 1.10 > 1"
    ]


def test_object_stores_beyond_dev_shm_are_named() -> None:
    big = config.parse(
        BASE.format(name="big", port=8001, backend="ray", memory=0.1)
        + "ray: {object_store_memory: 1073741824}\n"
    )
    other = claim_of(config.parse(BASE.format(name="o", port=8000, backend="ray", memory=0.1)
                                  + "ray: {object_store_memory: 1073741824}\n"))  # fmt: skip
    assert claims.clashes(big, "a", [other], 2**31) == []
    found = claims.clashes(big, "a", [other], 2**31 - 1)
    assert found == [
        "Ray's object stores (2048 MiB with the other clusters') exceed /dev/shm (2047 MiB)"
    ]


def test_a_claim_reads_back_its_clusters_backend_endpoint_and_health() -> None:
    read = claim_of(cluster("one", 8000, "native"))
    assert (read.backend, read.endpoint, read.health) == (
        "native",
        "http://10.0.0.1:8000/v1",
        "running",
    )
    assert read.nodes == {"a": {"serve": "running"}}


def unported(name: str, backend: str = "ray") -> config.Cluster:
    """A config that names no API port."""
    text = BASE.format(name=name, port=0, backend=backend, memory=0.4)
    return config.parse(text.replace("port: 0, ", ""))


def test_a_config_without_an_api_port_takes_the_first_slot_free_on_all_its_nodes() -> None:
    alone, why = slots.placed(unported("new"), {"a": {}, "b": {}})
    assert (alone.vllm.port, why) == (8000, None)
    # 'one' holds slot 0 on a, 'two' slot 1 on b: the first slot free on both is 2.
    seen = {
        "a": {"one": claim_of(cluster("one", 8000))},
        "b": {"two": claim_of(cluster("two", 8101))},
    }
    placed, why = slots.placed(unported("new", "native"), seen)
    assert placed.vllm.port == 8002
    assert why == "API port 8002 (slot 2): the slots below are taken by 'one', 'two'"
    assert claims.port_clashes(placed, list(seen["a"].values()) + list(seen["b"].values())) == []
    assert (ports.ray_gcs(placed), ports.group(placed)) == (6381, 29512)


def test_a_config_without_an_api_port_keeps_the_port_its_running_cluster_has() -> None:
    seen = {"a": {"new": claim_of(cluster("new", 8003)), "one": claim_of(cluster("one", 8000))}}
    assert slots.placed(unported("new"), seen) == (slots.at(unported("new"), 8003), None)
    # A config that names its port keeps it, clash or not (preflight names the clash).
    assert slots.placed(cluster("new", 8000), seen)[0].vllm.port == 8000


def test_a_cluster_of_our_name_from_another_config_file_is_a_name_clash() -> None:
    there = claim_of(cluster("one", 8000))  # rendered from c.yaml
    assert there.config == "c.yaml"
    assert not claims.foreign(there, "one", "c.yaml")  # ours: a changed config updates it
    assert claims.foreign(there, "one", "copy.yaml")
    assert claims.foreign(there, "two", "c.yaml")
    assert not claims.foreign(there, "one", "")  # a file name unknown: not judged
    found = claims.clashes(cluster("one", 8001), "a", [there], 2**33)
    assert found == [
        "the name 'one' is taken by the cluster started from c.yaml: a start would replace it"
    ]


def test_one_look_at_the_nodes_splits_into_the_other_clusters_and_the_nodes_where_ours_is() -> None:
    ours, copy = claim_of(cluster("one", 8000)), claim_of(cluster("one", 8000))
    copy.config = "copy.yaml"
    other = claim_of(cluster("two", 8003))
    seen = {"a": {"one": ours, "two": other}, "b": {"one": copy}, "c": {}}
    theirs, where = claims.split(seen, "one", "c.yaml")
    assert theirs == {"a": [other], "b": [copy], "c": []}
    assert where == {"a"}  # b holds a cluster of our name from another file: not ours


def test_a_cluster_whose_front_door_is_on_none_of_our_nodes_is_said_once() -> None:
    ours, other = cluster("one", 8000), cluster("two", 8001)
    no_door = config.parse(
        BASE.format(name="three", port=8002, backend="ray", memory=0.1)
        + "front_door: {enabled: false}\n"
    )
    door, serve = claim_of(other, "front-door"), claim_of(other)
    # Its door on a node that is not ours: said at the first node it is seen on, once.
    said = claims.apart(ours, {"a": [serve, claim_of(no_door)], "b": [serve]})
    assert said == {
        "a": [
            "'two' has its front door on a node this cluster is not on: neither routes to the"
            " other's model (add that node to this cluster's, or run its door here)"
        ]
    }
    # Its door on our worker (its head there) or beside ours on our head: the doors on our
    # nodes route to each other; nothing to say.
    assert claims.apart(ours, {"a": [serve], "b": [door]}) == {}
    assert claims.apart(ours, {"a": [door], "b": [serve]}) == {}
    # A cluster with no door, or ours without one: no route either way, nothing said.
    assert claims.apart(ours, {"b": [claim_of(no_door)]}) == {}
    off = config.parse(
        BASE.format(name="one", port=8000, backend="ray", memory=0.4)
        + "front_door: {enabled: false}\n"
    )
    assert claims.apart(off, {"b": [door]}) == {}


def test_with_replicas_each_node_says_its_replica_and_every_one_the_doors_endpoint() -> None:
    whole = config.parse(
        BASE.format(name="r", port=30000, backend="native", memory=0.4) + "replicas: 2\n"
    )
    seen: dict[str, list[SimpleNamespace]] = {}
    for group in whole.groups:
        for node in group.nodes:
            labels = {**NodeStack(group, node, "c.yaml", "w:1").labels,
                      "io.vllm-compose.service": "serve", "io.vllm-compose.node": node.name}  # fmt: skip
            state = SimpleNamespace(running=True, status="running", exit_code=0, health=None)
            seen[node.name] = [SimpleNamespace(name="x", config=SimpleNamespace(labels=labels),
                                               state=state)]  # fmt: skip
    found = claims.found(seen)["r"]  # type: ignore[arg-type]
    assert found.replicas == {"a": 1, "b": 2}
    assert found.endpoint == "http://10.0.0.1:30000/v1"  # the door's, read from either node
    assert claim_of(cluster("one", 8000)).replicas == {}  # one group: no replica label
