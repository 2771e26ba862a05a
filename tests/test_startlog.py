"""The phases of a start, read from real log lines: vLLM 0.32.0's CPU build serving TP=2 on the
testbed (native backend, torch.compile on), under the wrapper's supervisor."""

from __future__ import annotations

from generator.base import startlog

# In the order they came, copied from one start's serve log on the head (prefixes as Compose
# prints them dropped); lines that name no phase in between.
START = """\
vllm-compose: waiting for every member to join (192.168.200.13:29510)
vllm-compose: starting vllm (start 3aeb01d0b773ba1f)
(APIServer pid=15) INFO 12-01 12:51:49 [api_utils.py:286] non-default args: {'model_tag': '/var/lib/vllm-compose-testbed-models/tiny-llama', 'port': 30000}
(APIServer pid=15) WARNING 12-01 12:51:49 [cpu.py:317] Reset SSM cache type to float32 for accelerated GDN mamba backend 'none'.
(EngineCore pid=27) INFO 12-01 12:51:53 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: model='/var/lib/vllm-compose-testbed-models/tiny-llama', speculative_config=None
(Worker_TP0 pid=40) INFO 12-01 12:52:01 [cpu_model_runner.py:68] Starting to load model /var/lib/vllm-compose-testbed-models/tiny-llama...
(Worker_TP0 pid=40) INFO 12-01 12:52:01 [base_loader.py:82] Initializing model took 0.073040 seconds
Loading safetensors checkpoint shards:   0% Completed | 0/1 [00:00<?, ?it/s]
Loading safetensors checkpoint shards: 100% Completed | 1/1 [00:00<00:00, 502.01it/s]
(Worker_TP0 pid=40) INFO 12-01 12:52:01 [default_loader.py:501] Loading weights took 0.00 seconds
(EngineCore pid=27) INFO 12-01 12:52:02 [utils.py:347] Using LBHNC KV cache layout.
(Worker_TP0 pid=40) INFO 12-01 12:52:02 [cpu_model_runner.py:87] Warming up model for the compilation...
(Worker_TP0 pid=40) INFO 12-01 12:52:22 [monitor.py:91] [backbone] Initial profiling/warmup run took 0.33 s
(Worker_TP0 pid=40) INFO 12-01 12:52:23 [cpu_worker.py:260] Explicitly set (1.0/23.54) GiB for KV cache on node 0.
(EngineCore pid=27) INFO 12-01 12:52:23 [kv_cache_utils.py:2327] CPU KV cache size: 1,048,576 tokens, Maximum concurrency for 256 tokens per request: 4096.00x
(EngineCore pid=27) INFO 12-01 12:52:25 [core.py:402] init engine (profile, create kv cache, warmup model) took 22.30 s
(APIServer pid=15) INFO 12-01 12:52:25 [entry.py:140] Starting vLLM server on http://0.0.0.0:30000
INFO:     Waiting for application startup.
INFO:     Application startup complete.
"""


def test_a_real_start_is_read_as_its_phases_in_order() -> None:
    tracker = startlog.Tracker()
    began = [
        str(seen)
        for at, line in enumerate(START.splitlines())
        if (seen := tracker.advance(line, float(at)))
    ]
    assert began == [
        "waiting for the group",
        "starting vLLM",
        "initializing the engine",
        "loading weights",
        "compiling",
        "profiling memory, sizing the KV cache",
        "API up",
    ]
    assert tracker.since == float(len(START.splitlines()) - 3)  # "Starting vLLM server on"


def test_progress_within_a_phase_is_kept_but_not_said_again() -> None:
    tracker = startlog.Tracker()
    first = tracker.advance("Loading safetensors checkpoint shards:   0% Completed | 0/40", 1.0)
    assert str(first) == "loading weights 0%"
    assert (
        tracker.advance("Loading safetensors checkpoint shards:  45% Completed | 18/40", 9.0)
        is None
    )
    assert str(tracker.now) == "loading weights 45%" and tracker.since == 1.0


def test_ray_placement_wait_and_lines_of_no_phase() -> None:
    line = "(APIServer pid=1) INFO Waiting for creating a placement group of specs for 10 seconds."
    assert str(startlog.read(line)) == "waiting for Ray's placement group"
    assert startlog.read("INFO:     Waiting for application startup.") is None
    assert startlog.read("(EngineCore pid=27) INFO Using LBHNC KV cache layout.") is None
