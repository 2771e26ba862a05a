"""The GPU and memory readers (image/gpus.py) and what preflight, `top` and `watch` make of them
(generator/nodes/hardware.py), on real answers of an H200 and on the answers DGX Spark owners report
of a GB10 (tests/fixtures/README.md says where each came from). A FAKE nvidia-smi (a shell
script) stands in only where the test is of our own fallback logic."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gpus
import pytest

from generator import config
from generator.nodes import hardware
from generator.nodes.hardware import Gpu, Hardware
from generator.operations import checks as checking
from generator.operations import top
from tests.test_config import CASES

FIXTURES = Path(__file__).parent / "fixtures"
HEALTH = Path(__file__).parents[1] / "image" / "health.py"
OURS = gpus.FIELDS + gpus.NEWER
SPARK = config.load(CASES / "sample.yaml").model_copy(update={"profile": "dgx-spark"})
NODE = SPARK.nodes[0]
GIB = 2**30


def read(name: str) -> str:
    return (FIXTURES / name).read_text()


def gb10() -> list[Gpu]:
    return [Gpu.model_validate(g) for g in gpus.parse(read("nvidia-smi-gb10-our-query.csv"), OURS)]


def meminfo(total: float, free: float, available: float) -> dict[str, int]:
    return {"MemTotal": int(total * GIB), "MemFree": int(free * GIB),
            "MemAvailable": int(available * GIB)}  # fmt: skip


# The readers, on real and reported answers


def test_the_query_is_the_one_the_h200_answered() -> None:
    assert " ".join(gpus.query(OURS)) == read("nvidia-smi-h200-query.txt").strip()


def test_an_idle_h200_reads_as_nvidia_smi_says() -> None:
    (gpu,) = gpus.parse(read("nvidia-smi-h200-idle.csv"), OURS)
    assert gpu["name"] == "NVIDIA H200"
    assert (gpu["memory_total_mib"], gpu["memory_used_mib"]) == (143771.0, 0.0)
    assert (gpu["temperature_c"], gpu["to_slowdown_c"], gpu["power_limit_w"]) == (37, 50, 700)
    assert gpu["throttle"] == ["idle"]
    assert gpu["unified"] is False
    # PyTorch's total, a moment apart on the same GPU, is the same memory less the driver's own.
    total = int(read("torch-h200.txt").split()[-1])
    assert abs(total / 2**20 - gpu["memory_total_mib"]) < 1024


def test_an_h200_under_load_reads_its_power_cap_as_nvidia_smi_words_it() -> None:
    (gpu,) = gpus.parse(read("nvidia-smi-h200-loaded.csv"), OURS)
    said = read("nvidia-smi-q-h200-loaded.txt")
    assert gpu["throttle"] == ["sw_power_cap"]
    assert "SW Power Cap                                   : Active" in said
    assert "HW Thermal Slowdown                        : Not Active" in said
    assert f"GPU Current Temp                               : {gpu['temperature_c']:g} C" in said
    assert f"GPU T.Limit Temp                               : {gpu['to_slowdown_c']:g} C" in said
    assert gpu["power_w"] == 611.66 and gpu["utilization_percent"] == 99


def test_a_gb10_as_reported_reads_with_no_memory_and_the_rest_intact() -> None:
    reported = (
        ("memory.total", "memory_total_mib"), ("memory.used", "memory_used_mib"),
        ("memory.free", "memory_free_mib"), ("utilization.gpu", "utilization_percent"),
        ("power.draw", "power_w"), ("temperature.gpu", "temperature_c"),
    )  # fmt: skip
    (gpu,) = gpus.parse(read("nvidia-smi-gb10.csv"), reported)  # units and header as reported
    assert gpu["memory_total_mib"] is None and gpu["memory_free_mib"] is None
    assert (gpu["utilization_percent"], gpu["power_w"], gpu["temperature_c"]) == (0, 11.17, 35)


def test_a_gb10_is_unified_by_its_name_and_its_missing_memory_together() -> None:
    (spark,) = gb10()
    assert spark.unified and spark.memory_total_mib is None and spark.throttle is None
    line = "0, NVIDIA GB10, 131072, 1, 131071, 0, 35, 11.17, [N/A], 0x1, [N/A], ATS"
    assert gpus.parse(line, OURS)[0]["unified"] is False  # memory reported: it is the GPU's
    line = "0, Some Future GPU, [N/A], [N/A], [N/A], 0, 35, 11.17, [N/A], 0x1, [N/A], None"
    assert gpus.parse(line, OURS)[0]["unified"] is False  # the name alone is not enough, nor this


@pytest.mark.parametrize(
    ("mask", "names"),
    [
        ("0x0000000000000001", ["idle"]),
        ("0x0000000000000044", ["sw_power_cap", "hw_thermal_slowdown"]),
        ("0x0000000000000000", []),
        ("[N/A]", None),
        ("junk", None),
    ],
)
def test_clock_reasons_are_named_from_nvmls_bits(mask: str, names: list[str] | None) -> None:
    assert gpus.reasons(None if mask == "[N/A]" else mask) == names


def test_meminfo_reads_bytes(tmp_path: Path) -> None:
    (tmp_path / "m").write_text("MemTotal:       127605000 kB\nMemFree: 1 kB\nHugePages_Total: 0\n")
    assert gpus.meminfo(str(tmp_path / "m")) == {"MemTotal": 127605000 * 1024, "MemFree": 1024}
    assert gpus.meminfo(str(tmp_path / "absent")) is None


def fake_smi(folder: Path, answer: str, refuse_newer: bool) -> dict[str, str]:
    """A FAKE nvidia-smi on PATH: answers `answer`, or refuses the newer fields as old drivers do."""
    refuse = 'case "$*" in *tlimit*) echo "Field \\"temperature.gpu.tlimit\\" is not a valid field to query."; exit 2;; esac\n'
    (folder / "nvidia-smi").write_text(
        "#!/bin/sh\n" + (refuse if refuse_newer else "") + f"cat <<'EOF'\n{answer}\nEOF\n"
    )
    (folder / "nvidia-smi").chmod(0o755)
    return {**os.environ, "PATH": f"{folder}:{os.environ['PATH']}"}


def health(args: list[str], env: dict[str, str]) -> dict[str, object]:
    out = subprocess.run([sys.executable, str(HEALTH), *args], env=env, capture_output=True,
                         text=True, check=True, timeout=60)  # fmt: skip
    found: dict[str, object] = json.loads(out.stdout)
    return found


def test_facts_on_a_gb10_never_raise_and_say_unified(tmp_path: Path) -> None:
    env = fake_smi(tmp_path, read("nvidia-smi-gb10-our-query.csv").strip(), refuse_newer=False)
    found = health(["facts", "--interface", "lo", "--ip", "127.0.0.1", "--listen", "29417"], env)
    typed = checking.Facts.model_validate(found)
    assert typed.gpus == 1 and hardware.unified(typed.devices)
    assert typed.memory and typed.memory["MemTotal"] > 0


def test_an_older_driver_that_refuses_the_newer_fields_is_asked_again_without_them(
    tmp_path: Path,
) -> None:
    older = "0, Tesla V100-SXM2-32GB, 32768, 10, 32758, 0, 41, 40.5, 300.00, 0x0000000000000001"
    found = health(["gpus"], fake_smi(tmp_path, older, refuse_newer=True))
    devices = found["devices"]
    assert isinstance(devices, list) and len(devices) == 1
    gpu = devices[0]
    assert gpu["name"] == "Tesla V100-SXM2-32GB" and "to_slowdown_c" not in gpu
    assert found["gpu_error"] is None


def test_a_failing_nvidia_smi_is_named_not_raised(tmp_path: Path) -> None:
    said = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    (tmp_path / "nvidia-smi").write_text(f'#!/bin/sh\necho "{said}"\nexit 9\n')
    (tmp_path / "nvidia-smi").chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    found = health(["gpus"], env)
    assert found["devices"] is None
    assert "couldn't communicate with the NVIDIA driver" in str(found["gpu_error"])


# Preflight


def test_the_real_h200_facts_pass_every_gpu_check() -> None:
    f = checking.Facts.model_validate_json(read("health-facts-h200-idle.json"))
    found = hardware.checks(SPARK, NODE, {"mlx5_0/1": "ACTIVE"}, f.gpus, f.hardware, False)
    by = {c.name: c for c in found}
    assert by["gpus"].status == "pass" and "NVIDIA H200" in by["gpus"].cause
    assert by["heat"].status == "pass" and "GPU 0 37 °C, 79 W" in by["heat"].cause
    assert by["memory"].status == "skip"  # memory of its own


def test_every_sample_under_load_reads_and_passes_below_the_limit_and_fails_above_it() -> None:
    samples = json.loads(read("health-gpus-h200-under-load.json"))
    assert len(samples) >= 10
    for sample in samples:
        found = Hardware.model_validate(sample["gpus"])
        assert hardware.heat(SPARK, NODE, found).status == "pass"  # power cap is not heat
        cooler = SPARK.model_copy(update={"gpu_temperature_limit": 55})
        check = hardware.heat(cooler, NODE, found)
        assert check.status == "fail" and "at or over the 55 °C limit" in check.cause


def test_a_gpu_throttled_for_heat_fails_below_the_limit_too() -> None:
    hot = Gpu(index=1, temperature_c=84, throttle=["hw_thermal_slowdown"])
    check = hardware.heat(SPARK, NODE, Hardware(devices=[hot]))
    assert check.status == "fail"
    assert check.cause == "GPU 1 at 84 °C is throttled for heat (hw_thermal_slowdown)"
    assert "nvidia-smi -lgc" in check.hint


def test_unified_memory_that_holds_the_start_passes() -> None:
    # dgx-spark: vLLM 0.85 of 121.7 GiB (103.4) and Ray's store capped at 8 GiB.
    found = Hardware(devices=gb10(), memory=meminfo(121.7, 115, 118))
    check = hardware.memory(SPARK, NODE, found, serving=False)
    assert check.status == "pass", check
    assert check.cause == (
        "unified: 115.0 GiB free; vLLM (0.85 of 121.7 GiB) and Ray's object store (8.0 GiB)"
        " take 111.4 GiB"
    )


def test_unified_memory_held_by_the_page_cache_says_how_to_drop_it() -> None:
    found = Hardware(devices=gb10(), memory=meminfo(121.7, 60, 118))
    check = hardware.memory(SPARK, NODE, found, serving=False)
    assert check.status == "fail"
    assert check.cause.endswith("need 111.4 GiB, 60.0 GiB is free; the page cache holds 58.0 GiB"
                                " of the rest")  # fmt: skip
    assert check.hint == "vllm-compose preflight --drop-caches CONFIG drops it on every node"


def test_unified_memory_held_by_processes_says_so_with_the_figures() -> None:
    found = Hardware(devices=gb10(), memory=meminfo(121.7, 40, 50))
    check = hardware.memory(SPARK, NODE, found, serving=False)
    assert check.status == "fail"
    assert "need 111.4 GiB, 40.0 GiB is free, 50.0 GiB with the page cache dropped" in check.cause
    assert "gpu_memory_utilization" in check.hint


def test_unified_memory_is_not_judged_while_this_stack_serves_from_it() -> None:
    found = Hardware(devices=gb10(), memory=meminfo(121.7, 5, 6))
    assert hardware.memory(SPARK, NODE, found, serving=True).status == "skip"


def test_ray_s_default_store_counts_when_none_is_set() -> None:
    generic = SPARK.model_copy(update={"profile": "generic"})  # no cap: Ray takes 30%
    vllm, store = hardware.needed(generic, meminfo(100, 90, 90))
    assert (round(vllm / GIB, 1), round(store / GIB, 1)) == (85.0, 27.0)


def test_preflight_on_gb10_facts_names_the_gpu_as_unified_and_raises_nothing() -> None:
    f = json.loads(read("health-facts-h200-idle.json"))
    f["devices"] = [g.model_dump() for g in gb10()]
    f["memory"] = meminfo(121.7, 115, 118)
    typed = checking.Facts.model_validate(f)
    found = hardware.checks(SPARK, NODE, {"mlx5_0/1": "ACTIVE"}, typed.gpus, typed.hardware, False)
    by = {c.name: c for c in found}
    assert by["gpus"].cause == "1 GPUs visible (NVIDIA GB10, unified memory)"
    assert by["heat"].status == "pass" and by["memory"].status == "pass"


# top and watch


def test_top_shows_a_gb10_with_the_nodes_memory_marked_unified() -> None:
    found = Hardware(devices=gb10(), memory=meminfo(121.7, 100, 110))
    assert hardware.describe(found) == "35 °C 11 W 0% 12/122 GiB unified"
    row = top.NodeRow(node="spark1", ip="10.0.0.1", hardware=found)
    view = top.Top(nodes=[row], endpoint=None, endpoint_error="down")
    assert top.lines(view)[2] == "  gpu 0              35 °C 11 W 0% 12/122 GiB unified"


def test_top_shows_an_h200_under_load_with_its_clock_reason() -> None:
    sample = json.loads(read("health-gpus-h200-under-load.json"))[-1]
    shown = hardware.describe(Hardware.model_validate(sample["gpus"]))
    assert shown.endswith("[sw_power_cap]") and "/140 GiB" in shown


def test_top_says_why_a_node_shows_no_gpu() -> None:
    assert hardware.describe(Hardware(gpu_error="no nvidia-smi")) == "no nvidia-smi"
    unknown = Gpu(index=0, name="x", temperature_c=None, power_w=None)
    assert hardware.describe(Hardware(devices=[unknown])) == "? °C ? W n/a memory n/a"


def test_watch_s_reading_is_near_a_few_degrees_under_the_limit() -> None:
    warm = Hardware(devices=[Gpu(index=0, temperature_c=86)])
    assert hardware.reading(warm, 90) == hardware.Reading(86, None, near=True)
    assert hardware.reading(warm, 95).near is False
    assert hardware.reading(warm, 86).too_hot == "GPU 0 at 86 °C, at or over the 86 °C limit"
