"""Model copy throughput: `vllm-compose sync-model` against raw `tar | nc` over the same emulated
link, in the same run; then the bytes a second sync moves (goal: 0).

    python -m benchmarks.model_sync [--size-mb N]

Two emulated nodes (tests/support/testbed.py), the Ray stand-in image as the base, a model of four
random files on the head only. The lock is written first (not timed: it hashes the model once, as
`vllm-compose lock` does); sync-model then checks every received byte against it. The raw copy runs
`tar -c | nc` in the head's network namespace and `nc -l | tar -x` in the worker's, with no check at
all.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from python_on_whales import DockerClient

from benchmarks.report import Figure, record
from tests.support import clusters, images
from tests.support.testbed import MODELS, Testbed, borrowed

WORK = Path("/tmp/vllm-compose-bench-sync")
NAME = "bench-model"


def cli(*args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "generator", *args], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(result.stderr)
    return result.stdout


def raw_copy(bed: Testbed, source: Path, target: Path) -> float:
    head, worker = bed.nodes[:2]
    target.mkdir(parents=True)
    port = "47999"
    receiver = subprocess.Popen(
        worker.inside("sh", "-c", f"nc -l -N {worker.ip} {port} | tar -x -C {target}")
    )
    time.sleep(0.5)
    start = time.monotonic()
    subprocess.run(
        head.inside("sh", "-c", f"tar -c -C {source} . | nc -N {worker.ip} {port}"), check=True
    )
    if receiver.wait(timeout=600) != 0:
        raise RuntimeError("raw copy failed")
    return time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.model_sync")
    parser.add_argument("--size-mb", type=int, default=1024, help="model size (default 1024)")
    size = parser.parse_args().size_mb << 20

    print("setup: stand-in image, two emulated nodes, a random model on the head (not timed)")
    image = images.standin_base(DockerClient())
    with borrowed(2) as bed:
        head, worker = bed.nodes[:2]
        source = Path(head.models) / NAME
        try:
            bed.load_image(image, nodes=[head, worker])
            shutil.rmtree(source, ignore_errors=True)
            source.mkdir(parents=True)
            for i in range(4):
                (source / f"model-{i:05d}.safetensors").write_bytes(os.urandom(size // 4))
            WORK.mkdir(exist_ok=True)
            config = clusters.write_config(
                WORK / "c.yaml", "bench-sync", [head, worker], image, model=f"{MODELS}/{NAME}"
            )
            (WORK / "c.lock.json").unlink(missing_ok=True)
            cli("lock", str(config))

            bed.remove_path(worker, NAME)
            raw = raw_copy(bed, source, Path(worker.models) / NAME)
            bed.remove_path(worker, NAME)
            start = time.monotonic()
            first = cli("sync-model", str(config)).strip().splitlines()[-1]
            ours = time.monotonic() - start
            start = time.monotonic()
            second = cli("sync-model", str(config)).strip().splitlines()[-1]
            again = time.monotonic() - start
        finally:
            bed.remove_path(head, NAME)
            bed.remove_path(worker, NAME)

    mb = size / 1e6
    print()
    print(f"model: 4 files, {size >> 20} MiB, head -> worker over the emulated link")
    print(f"  raw tar | nc:            {raw:6.1f} s  {mb / raw:7.1f} MB/s  (no check)")
    print(f"  vllm-compose sync-model: {ours:6.1f} s  {mb / ours:7.1f} MB/s  ({first})")
    print(f"  throughput ratio sync-model / raw: {raw / ours:.2f}   (goal >= 0.9)")
    print(f"  second sync-model: {again:.1f} s, {second}   (goal: 0 B moved)")
    figures = [
        Figure(f"raw tar | nc, {size >> 20} MiB", f"{raw:.1f} s ({mb / raw:.0f} MB/s)"),
        Figure(f"sync-model, {size >> 20} MiB", f"{ours:.1f} s ({mb / ours:.0f} MB/s)"),
        Figure("sync-model / raw (throughput)", f"{raw / ours:.2f}", ">= 0.9", raw / ours >= 0.9),
        Figure(
            "a second sync-model",
            f"{again:.1f} s, {second}",
            "0 B moved",
            " 0 B moved" in f" {second}",
        ),
    ]
    about = (
        "Two emulated nodes, a model of four random files on the head only, locked first."
        " `vllm-compose sync-model` (sha256 of every received byte against the lock) against"
        " raw `tar -c | nc` into `nc -l | tar -x` over the same link (no check), in one run."
    )
    record("Model sync", about, "throughput >= 0.9x raw; a second sync moves 0 bytes", figures)


if __name__ == "__main__":
    main()
