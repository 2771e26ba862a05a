"""Time to the named error: one injected fault at a time on the emulated nodes, timed from starting
`vllm-compose preflight` to its exit with the failed check named. Goal: <= 5 s each.

    python -m benchmarks.time_to_named_error

The Ray stand-in image (tests/support/images.py) on three emulated nodes (tests/support/testbed.py);
each fault is undone before the next. A healthy run is timed too, as the baseline.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from python_on_whales import DockerClient

from benchmarks.report import Figure, record
from tests.support import clusters, images
from tests.support.testbed import Testbed, borrowed, sh

GOAL = 5.0  # seconds to the named error, each fault

WORK = Path("/tmp/vllm-compose-bench-errors")
Fault = Callable[[Testbed, Path], contextlib.AbstractContextManager[None]]


@contextlib.contextmanager
def nothing(bed: Testbed, config: Path) -> Iterator[None]:
    yield


@contextlib.contextmanager
def dead_context(bed: Testbed, config: Path) -> Iterator[None]:
    sh("docker", "context", "create", "bench-dead", "--docker", "host=unix:///run/bench-dead.sock")
    config.write_text(config.read_text().replace(bed.nodes[1].context, "bench-dead"))
    try:
        yield
    finally:
        sh("docker", "context", "rm", "-f", "bench-dead")


@contextlib.contextmanager
def link_down(bed: Testbed, config: Path) -> Iterator[None]:
    bed.link_down(bed.nodes[1])
    try:
        yield
    finally:
        bed.link_up(bed.nodes[1])


@contextlib.contextmanager
def wrong_ip(bed: Testbed, config: Path) -> Iterator[None]:
    config.write_text(config.read_text().replace("ip: 192.168.200.13", "ip: 192.168.200.14"))
    yield


@contextlib.contextmanager
def dropped(bed: Testbed, config: Path) -> Iterator[None]:
    head, worker = bed.nodes[:2]
    bed.drop(head, worker.ip)
    try:
        yield
    finally:
        bed.undrop(head, worker.ip)


@contextlib.contextmanager
def no_ray(bed: Testbed, config: Path) -> Iterator[None]:
    bed.load_image(images.DEBIAN, nodes=bed.nodes[:2])
    config.write_text(config.read_text().replace(images.STANDIN, images.DEBIAN))
    yield


@contextlib.contextmanager
def model_file_missing(bed: Testbed, config: Path) -> Iterator[None]:
    bed.remove_path(bed.nodes[1], "standin-model/config.json")
    try:
        yield
    finally:
        clusters.place_standin_model(bed)


@contextlib.contextmanager
def small_shm(bed: Testbed, config: Path) -> Iterator[None]:
    bed.shm_size(bed.nodes[0], "64m")
    try:
        yield
    finally:
        bed.shm_size(bed.nodes[0], "4g")


@contextlib.contextmanager
def memory_monitor_on(bed: Testbed, config: Path) -> Iterator[None]:
    config.write_text(config.read_text() + "env: {RAY_memory_monitor_refresh_ms: '250'}\n")
    yield


@contextlib.contextmanager
def api_port_taken(bed: Testbed, config: Path) -> Iterator[None]:
    with bed.listening(bed.nodes[0], 30000, images.STANDIN):
        yield


FAULTS: list[tuple[str, Fault]] = [
    ("none (healthy)", nothing),
    ("context does not answer", dead_context),
    ("interface down", link_down),
    ("interface lacks the IP", wrong_ip),
    ("peer unreachable", dropped),
    ("no ray in image", no_ray),
    ("model file missing", model_file_missing),
    ("/dev/shm too small", small_shm),
    ("memory monitor on", memory_monitor_on),
    ("API port taken", api_port_taken),
]


def main() -> None:
    print("setup: stand-in image on three emulated nodes (not timed)", flush=True)
    image = images.standin_base(DockerClient())
    rows = []
    with borrowed(3) as bed:
        bed.load_image(image)
        clusters.place_standin_model(bed)
        WORK.mkdir(exist_ok=True)
        config = WORK / "c.yaml"
        clusters.write_config(config, "bench-errors", bed.nodes[:2], image)
        # Not timed: the wrapper image built on the nodes.
        subprocess.run([sys.executable, "-m", "generator", "preflight", str(config)], check=False,
                       capture_output=True)  # fmt: skip
        for name, fault in FAULTS:
            clusters.write_config(config, "bench-errors", bed.nodes[:2], image)
            with fault(bed, config):
                start = time.monotonic()
                result = subprocess.run(
                    [sys.executable, "-m", "generator", "preflight", str(config), "--json"],
                    capture_output=True,
                    text=True,
                    check=False,
                )
                took = time.monotonic() - start
            checks = json.loads(result.stdout or "[]")
            named = [
                f"{c['name']} {c['node']}: {c['cause']}" for c in checks if c["status"] == "fail"
            ]
            rows.append((name, took, named[0] if named else "(no failure)", len(named)))
            print(f"{name:26} {took:5.1f} s  {rows[-1][2]}", flush=True)
    print()
    print("| fault | time to the named error | first failed check (of n) |")
    print("| --- | --- | --- |")
    for name, took, first, n in rows:
        print(f"| {name} | {took:.1f} s | {first} ({n}) |")
    worst = max(took for name, took, _, _ in rows)
    print(f"\nslowest: {worst:.1f} s (goal <= {GOAL:g} s each)")
    figures = [
        Figure(name, f"{took:.1f} s", f"<= {GOAL:g} s", took <= GOAL) for name, took, _, _ in rows
    ]
    about = (
        "Three emulated nodes, the Ray stand-in image, a two-node config; one fault injected"
        " at a time and undone after; timed from starting `vllm-compose preflight --json` to"
        " its exit."
    )
    record("Time to the named error", about, f"each fault named in <= {GOAL:g} s", figures)


if __name__ == "__main__":
    main()
