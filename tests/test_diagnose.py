"""The cause named from a failed service's log. The log lines are excerpts of real vLLM 0.32.0
logs seen on the testbed."""

from __future__ import annotations

from generator import config
from generator.operations import diagnose
from tests.test_config import CASES

VLLM_RAY_ON_CPU = """\
(APIServer pid=261) WARNING 11-30 10:06:54 [system_utils.py:255] Found ulimit of 20000 and failed \
to automatically increase with error current limit exceeds maximum limit. This can cause fd limit \
errors like `OSError: [Errno 24] Too many open files`. Consider increasing with ulimit -n
2026-11-30 10:07:08,109	INFO worker.py:2024 -- Connected to Ray cluster.
(EngineCore pid=327) ERROR 11-30 10:07:08 [core.py:1510] EngineCore failed to start.
(EngineCore pid=327) ERROR 11-30 10:07:08 [core.py:1510] Traceback (most recent call last):
(EngineCore pid=327) ERROR 11-30 10:07:08 [core.py:1510]     super().__init__(vllm_config)
(EngineCore pid=327) ERROR 11-30 10:07:08 [core.py:1510] ValueError: current platform cpu does \
not support ray.
Traceback (most recent call last):
  File "/opt/site/vllm/v1/engine/utils.py", line 1431, in wait_for_engine_startup
    raise RuntimeError(
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""

SHM = """\
(EngineCore pid=26) ERROR 11-30 10:02:17 [core.py:1510]     raise RuntimeError(
(EngineCore pid=26) ERROR 11-30 10:02:17 [core.py:1510] RuntimeError: Insufficient space in \
/dev/shm for shared-memory allocation: 160 MiB required, 64 MiB free. Increase /dev/shm (e.g. \
--shm-size or --ipc=host).
"""


def test_the_root_cause_not_the_wrapper_nor_a_warning_quoting_an_error() -> None:
    assert (
        diagnose.cause(VLLM_RAY_ON_CPU) == "ValueError: current platform cpu does not support ray."
    )


def test_a_prefixed_runtime_error() -> None:
    assert diagnose.cause(SHM) == (
        "RuntimeError: Insufficient space in /dev/shm for shared-memory allocation: 160 MiB "
        "required, 64 MiB free. Increase /dev/shm (e.g. --shm-size or --ipc=host)."
    )


def test_plain_traceback_and_dotted_names() -> None:
    log = "Traceback (most recent call last):\n  File 'x'\nray.exceptions.RaySystemError: gone\n"
    assert diagnose.cause(log) == "ray.exceptions.RaySystemError: gone"


def test_no_exception_no_cause() -> None:
    assert diagnose.cause("INFO started\nWARNING slow\n") is None


def marker(line: str) -> str | None:
    tripped = diagnose.guard(line)
    return tripped.marker if tripped else None


def test_guards_trip_on_the_lines_vllm_and_ray_print() -> None:
    # The texts as vLLM 0.32.0 formats them (vllm/v1/executor/ray_utils.py,
    # vllm/utils/system_utils.py) and as Ray's raylet reports an OOM kill.
    placement = (
        "(EngineCore pid=80) INFO 11-30 10:07:18 [ray_utils.py:468] Waiting for creating a "
        "placement group of specs for 10 seconds. specs=[{'GPU': 1.0, 'node:192.168.200.12': "
        "0.001}, {'GPU': 1.0}]. Check `ray status` and `ray list nodes` to see if you have enough "
        "resources"
    )
    overwrite = (
        "(RayWorkerWrapper pid=311) WARNING 11-30 10:08:01 [system_utils.py:34] Overwriting "
        "environment variable NCCL_SOCKET_IFNAME from 'enp1s0f1np1' to 'eth0'"
    )
    oom = (
        "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory. "
        "Ray killed this worker (ID: 4f1e) because it was the most recently scheduled task"
    )
    assert marker(placement) == "Waiting for creating a placement group"
    assert marker(overwrite) == (
        "Overwriting environment variable "
        "(VLLM_HOST_IP|NCCL_SOCKET_IFNAME|GLOO_SOCKET_IFNAME|NCCL_IB_HCA) "
    )
    assert marker(oom) == "Ray killed this worker"
    assert diagnose.guard("(RayWorkerWrapper) Overwriting environment variable HF_HOME") is None
    # The same on every node (the config's env): overwriting it changes nothing.
    same = "Overwriting environment variable NCCL_DEBUG from 'WARN' to 'INFO'"
    assert diagnose.guard(same) is None
    assert diagnose.guard("INFO Application startup complete.") is None


def test_the_placement_shortfall_names_each_node_that_lacks_slots() -> None:
    cluster = config.load(CASES / "sample.yaml")  # spark-1 .12 and spark-2 .13, one GPU each
    full = {"192.168.200.12": {"gpus": 1, "free": 1}, "192.168.200.13": {"gpus": 1, "free": 1}}
    assert diagnose.placement_shortfall(cluster, full) == []
    held = {**full, "192.168.200.13": {"gpus": 1, "free": 0}}
    assert diagnose.placement_shortfall(cluster, held) == [
        "spark-2 has 0 of 1 GPU slots free (held by another Ray job)"
    ]
    elsewhere = {"192.168.200.12": {"gpus": 1, "free": 1}, "198.51.100.2": {"gpus": 1, "free": 1}}
    assert diagnose.placement_shortfall(cluster, elsewhere) == [
        "spark-2 is not alive in Ray at 192.168.200.13 (alive: 192.168.200.12, 198.51.100.2)"
    ]


def test_a_group_made_after_vllm_said_it_waits_is_a_slow_placement_not_a_stuck_one() -> None:
    cluster = config.load(CASES / "sample.yaml")  # TP 2 over two nodes of one GPU each
    made = {ip: {"gpus": 1, "free": 0, "placed": 1} for ip in ("192.168.200.12", "192.168.200.13")}
    assert diagnose.group_placed(cluster, made)
    # Held by an actor of another job, not by a placement group: still a stuck placement.
    held = {**made, "192.168.200.13": {"gpus": 1, "free": 0, "placed": 0}}
    assert not diagnose.group_placed(cluster, held)
    assert not diagnose.group_placed(cluster, {"192.168.200.12": {"gpus": 1, "free": 1}})
