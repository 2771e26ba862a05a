"""The node's GPUs as nvidia-smi reports them, and its memory as /proc/meminfo does (standard
library only; `vllm-compose-health gpus` prints both, preflight's facts carry them).

Every field may be missing: a GB10 (DGX Spark) answers `[N/A]` for its memory, since its GPU has
none of its own and shares the node's (NVML says NOT_SUPPORTED), and older drivers lack the newer
fields. A field nvidia-smi cannot give is None here, never an error. A GPU is unified when NVML
reports no memory of its own *and* its name is one of NVIDIA's unified-memory parts: then the
node's memory is the GPU's, read from /proc/meminfo.
"""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

# (nvidia-smi's field, our key). `clocks_throttle_reasons.active` is the name every driver
# knows (newer ones call it clocks_event_reasons.active and still take this one).
FIELDS = (
    ("index", "index"),
    ("name", "name"),
    ("memory.total", "memory_total_mib"),
    ("memory.used", "memory_used_mib"),
    ("memory.free", "memory_free_mib"),
    ("utilization.gpu", "utilization_percent"),
    ("temperature.gpu", "temperature_c"),
    ("power.draw", "power_w"),
    ("power.limit", "power_limit_w"),
    ("clocks_throttle_reasons.active", "reasons"),
)
# Only newer drivers (R530 and later) know these: asked for, and left out when refused.
NEWER = (("temperature.gpu.tlimit", "to_slowdown_c"), ("addressing_mode", "addressing"))
TEXT = {"name", "reasons", "addressing"}
NOT_REPORTED = {"", "N/A", "[N/A]", "Not Supported", "[Not Supported]", "[Unknown Error]"}
# GPUs that share the node's memory and have none of their own (name as nvidia-smi gives it).
UNIFIED_NAMES = ("GB10",)
# NVML's clock event reasons (nvmlClocksEventReasons), bit -> our name.
REASONS = {
    0x1: "idle",
    0x2: "applications_clocks",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clocks",
}
HEAT = ("sw_thermal_slowdown", "hw_thermal_slowdown")
MEMINFO = ("MemTotal", "MemFree", "MemAvailable", "Buffers", "Cached", "SwapTotal", "SwapFree")
TIMEOUT = 20  # nvidia-smi can hang on a GPU that fell off the bus


def query(fields: tuple[tuple[str, str], ...]) -> list[str]:
    return [
        "nvidia-smi",
        f"--query-gpu={','.join(f for f, _ in fields)}",
        "--format=csv,noheader,nounits",
    ]


def parse(text: str, fields: tuple[tuple[str, str], ...]) -> list[dict[str, Any]]:
    """nvidia-smi's CSV -> one dict a GPU, `[N/A]` and the like as None."""
    found = []
    for line in text.splitlines():
        values = [v.strip() for v in line.split(",")]
        if len(values) != len(fields) or values[0].split(" [")[0] == fields[0][0]:
            continue  # not a GPU's line, or the header (`--format=csv` without noheader)
        gpu = {key: _value(key, v) for (_, key), v in zip(fields, values, strict=True)}
        gpu["throttle"] = reasons(gpu.pop("reasons", None))
        name = str(gpu.get("name") or "")
        no_memory = gpu.get("memory_total_mib") is None
        gpu["unified"] = no_memory and any(part in name for part in UNIFIED_NAMES)
        found.append(gpu)
    return found


def _value(key: str, raw: str) -> Any:
    if raw in NOT_REPORTED:
        return None
    if key in TEXT:
        return raw
    try:
        number = float(raw.split()[0])  # "11.17 W" where units were asked for
    except ValueError:
        return None
    return int(number) if key == "index" else number


def reasons(mask: str | None) -> list[str] | None:
    """The active clock event reasons of a bitmask like 0x0000000000000044; None if unknown."""
    if mask is None:
        return None
    try:
        bits = int(mask, 16)
    except ValueError:
        return None
    return [name for bit, name in REASONS.items() if bits & bit]


def meminfo(path: str = "/proc/meminfo") -> dict[str, int] | None:
    """The node's memory in bytes (a container sees the node's /proc/meminfo)."""
    found: dict[str, int] = {}
    try:
        with open(path) as f:
            for line in f:
                key, _, rest = line.partition(":")
                words = rest.split()
                if key in MEMINFO and words and words[0].isdigit():
                    found[key] = int(words[0]) * (1024 if words[1:] == ["kB"] else 1)
    except OSError:
        return None
    return found or None


def devices() -> tuple[list[dict[str, Any]] | None, str | None]:
    """(one dict a GPU, None) or (None, why not): no nvidia-smi, or it failed."""
    if not shutil.which("nvidia-smi"):
        return None, "no nvidia-smi"
    said = ""
    for fields in (FIELDS + NEWER, FIELDS):
        try:
            out = subprocess.run(query(fields), capture_output=True, text=True, timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            return None, f"nvidia-smi did not answer in {TIMEOUT} s"
        if out.returncode == 0:
            return parse(out.stdout, fields), None
        lines = (out.stdout + out.stderr).strip().splitlines()
        said = lines[-1] if lines else f"exit {out.returncode}"
        if "not a valid field" not in said:
            break
    return None, f"nvidia-smi failed: {said}"


def report() -> dict[str, Any]:
    """What `gpus` prints and facts carry: the GPUs, why they are missing, the node's memory."""
    found, error = devices()
    return {"devices": found, "gpu_error": error, "memory": meminfo()}
