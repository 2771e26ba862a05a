"""top's view from its figures (our logic alone; the live view on the testbed is in test_e2e.py)."""

from __future__ import annotations

from generator.nodes.hardware import Gpu, Hardware
from generator.operations import top


def test_a_row_per_node_and_the_endpoints_load_on_the_heads_row() -> None:
    view = top.Top(
        nodes=[
            top.NodeRow(
                node="spark1",
                ip="10.0.0.1",
                services={"serve": "running, healthy"},
                cpu_percent=153.2,
                memory_bytes=3 * 2**30,
                hardware=Hardware(
                    devices=[
                        Gpu(
                            index=0,
                            temperature_c=71,
                            power_w=512.4,
                            utilization_percent=97.0,
                            memory_used_mib=104448.0,
                            memory_total_mib=122880.0,
                            throttle=["sw_power_cap"],
                        )
                    ]
                ),
            ),
            top.NodeRow(node="spark2", ip="", error="engine does not answer"),
        ],
        endpoint=top.Endpoint(
            running=2,
            waiting=5,
            kv_cache_percent=41.5,
            prompt_tokens_per_s=120.0,
            generation_tokens_per_s=33.5,
        ),
    )
    said = top.lines(view)
    assert said == [
        "NODE / SERVICE       STATE                                     CPU       MEMORY",
        "spark1               10.0.0.1                                 153%      3.0 GiB",
        "  gpu 0              71 °C 512 W 97% 102/120 GiB [sw_power_cap]",
        "  serve              running, healthy",
        "spark2               engine does not answer                      -            -",
        "endpoint: 2 running, 5 waiting; KV cache 41.5%; tokens/s in/out: 120.0/33.5",
    ]
    assert all(len(line) <= 80 for line in said)


def test_every_line_fits_80_columns_with_every_service_a_line_of_its_own() -> None:
    services = {name: "running (health: starting)" for name in
                ("ray", "serve", "front-door", "front-door-counts", "node-exporter", "dcgm-exporter")}  # fmt: skip
    row = top.NodeRow(node="spark-node-with-a-long-name", ip="192.168.200.12", services=services,
                      cpu_percent=1234.5, memory_bytes=130 * 2**30, error=None)  # fmt: skip
    said = top.lines(top.Top(nodes=[row], endpoint=None, endpoint_error="x" * 200))
    assert max(len(line) for line in said) <= 80
    assert [line.split()[0] for line in said[2:-1]] == list(services)


def test_an_endpoint_that_did_not_answer_shows_no_figures_and_a_first_sample_no_rates() -> None:
    row = top.NodeRow(node="spark1", ip="10.0.0.1")
    silent = top.Top(nodes=[row], endpoint=None, endpoint_error="vLLM's /metrics did not answer")
    assert top.lines(silent)[-1] == "endpoint: vLLM's /metrics did not answer"
    first = top.Top(nodes=[row], endpoint=top.Endpoint(running=0, waiting=1, kv_cache_percent=0))
    assert top.lines(first)[-1] == "endpoint: 0 running, 1 waiting; KV cache 0%; tokens/s in/out: -"


def test_rates_are_per_second_and_never_negative() -> None:
    before, now = {"tokens": 100.0, "prompt_tokens": 50.0}, {"tokens": 160.0, "prompt_tokens": 0.0}
    assert top._rate(now, before, "tokens", 2.0) == 30.0
    assert top._rate(now, before, "prompt_tokens", 2.0) == 0.0  # a restarted vLLM counts afresh


def test_replicas_each_show_their_load_and_door_share_and_the_endpoint_is_their_sum() -> None:
    loads = [
        {"running": 2.0, "waiting": 1.0, "kv_cache": 0.4, "tokens": 160.0, "prompt_tokens": 60.0},
        {"running": 1.0, "waiting": 0.0, "kv_cache": 0.2, "tokens": 100.0, "prompt_tokens": 40.0},
    ]
    before = [{"tokens": 100.0, "prompt_tokens": 20.0}, {"tokens": 80.0, "prompt_tokens": 40.0}]
    ends = [top._endpoint_of(load, last, 2.0) for load, last in zip(loads, before, strict=True)]
    assert [e.generation_tokens_per_s for e in ends if e] == [30.0, 10.0]
    whole = top._summed([e for e in ends if e], rates=True)
    assert (whole.running, whole.waiting, whole.kv_cache_percent) == (3.0, 1.0, 30.0)
    assert (whole.prompt_tokens_per_s, whole.generation_tokens_per_s) == (20.0, 40.0)
    replicas = [
        top.Replica(replica=1, endpoint=ends[0], door="UP", requests=60, share_percent=60.0),
        top.Replica(replica=2, endpoint=None, door="DOWN", requests=40, share_percent=40.0),
    ]
    view = top.Top(nodes=[], endpoint=whole, replicas=replicas,
                   endpoint_error="1 of 2 replicas' /metrics did not answer")  # fmt: skip
    assert top.lines(view)[1:] == [
        "replica 1: UP, 60% of requests; 2 running, 1 waiting; KV 40%; tok/s 20.0/30.0",
        "replica 2: DOWN, 40% of requests; /metrics did not answer",
        "endpoint: 3 running, 1 waiting; KV cache 30%; tokens/s in/out: 20.0/40.0",
    ]
    assert top._endpoint_of({}, before[0], 2.0) is None  # no /metrics: no figures
