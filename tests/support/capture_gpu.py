"""Captures the GPU fixtures on a machine with a real NVIDIA GPU (Python, PyTorch, nvidia-smi; no
Docker, no vLLM needed): the health tool's `gpus` and `facts` run directly with Python, the raw
CSV of the exact nvidia-smi query they make, and the same while a bounded matrix-multiply load
heats the GPU; beside them what PyTorch and `nvidia-smi -q` say, to check the figures against.

    python -m tests.support.capture_gpu OUT_FOLDER [--load-seconds 90]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

IMAGE = Path(__file__).resolve().parents[2] / "image"
sys.path.insert(0, str(IMAGE))

import gpus  # noqa: E402  (the health tool's module, as the image has it)

HEALTH = [sys.executable, str(IMAGE / "health.py")]
LOAD = """
import sys, time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    for _ in range(50):
        a = (a @ a).clamp_(-1, 1)
    torch.cuda.synchronize()
"""


def _run(cmd: list[str]) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120).stdout


def capture(out: Path, load_seconds: float) -> None:
    out.mkdir(parents=True, exist_ok=True)
    fields = gpus.FIELDS + gpus.NEWER
    (out / "query.txt").write_text(" ".join(gpus.query(fields)) + "\n")
    (out / "idle.csv").write_text(_run(gpus.query(fields)))
    (out / "gpus-idle.json").write_text(_run([*HEALTH, "gpus"]))
    facts = [*HEALTH, "facts", "--interface", "lo", "--ip", "127.0.0.1", "--listen", "29411"]
    (out / "facts-idle.json").write_text(_run(facts))
    check = "import torch; print(torch.cuda.get_device_name(), *torch.cuda.mem_get_info())"
    (out / "torch.txt").write_text(_run([sys.executable, "-c", check]))
    load = subprocess.Popen([sys.executable, "-c", LOAD, str(load_seconds)])
    samples, end = [], time.monotonic() + load_seconds
    try:
        while time.monotonic() < end and load.poll() is None:
            time.sleep(5)
            samples.append({"t": round(load_seconds - (end - time.monotonic()), 1),
                            "gpus": json.loads(_run([*HEALTH, "gpus"]))})  # fmt: skip
        (out / "loaded.csv").write_text(_run(gpus.query(fields)))
        (out / "q-loaded.txt").write_text(
            _run(["nvidia-smi", "-q", "-d", "TEMPERATURE,POWER,PERFORMANCE"])
        )
    finally:
        load.wait(timeout=load_seconds + 60)
    (out / "gpus-under-load.json").write_text(json.dumps(samples, indent=1) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--load-seconds", type=float, default=90)
    args = parser.parse_args()
    capture(args.out, args.load_seconds)
