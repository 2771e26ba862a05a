"""Day two, side by side in one run on the same testbed: warm restart, watch's recovery, upgrade
downtime and a power cut, each against a cold or warm start of the same group.

    python -m benchmarks.day_two [--backend native|ray]

Real vLLM (CPU build) with torch.compile on (the test image plus a C++ compiler, so that the
compile cache matters as it does on GPUs), TP=2 over two emulated nodes. Ratios:

- warm start / cold start: `up` after the containers were removed (compile caches kept), against
  `up` with no caches (after `down`, which removes them);
- watch recovery / cold start: the worker's serve or Ray container killed, to serving again;
- upgrade downtime / warm start: `upgrade` to an added environment variable (same image and vLLM
  config: warm caches), its own figure of old group stopped to new group answering;
- reboot / cold start: both nodes' power cut (engines and containers killed at once), from the
  engines back to serving again.
"""

from __future__ import annotations

import argparse
import re
import shutil
import time
from pathlib import Path

from python_on_whales import DockerClient

from benchmarks.common import MODEL, PORT, serving, tool
from benchmarks.report import Figure, record
from tests.support import clusters, images
from tests.support.testbed import Node, Testbed, borrowed

WORK = Path("/tmp/vllm-compose-day-two")


def timed_up(config: Path, head: Node) -> float:
    start = time.monotonic()
    tool("up", config)
    serving(str(head.ip), clusters.api_key(config))
    return time.monotonic() - start


def remove_containers(nodes: list[Node]) -> None:
    """What a recreate does: the containers go, the volumes (compile caches) stay."""
    for node in nodes:
        ids = [c.id for c in clusters.containers(node, "daytwo").values()]
        if ids:
            node.docker.container.remove(ids, force=True)


def watch_recovery(config: Path, bed: Testbed, backend: str) -> float:
    worker = bed.nodes[1]
    watcher = clusters.Background("watch", config, cwd=WORK)  # at its defaults, as users run it
    try:
        watcher.wait_for("watch: ok", 300)
        worker.docker.container.kill(f"daytwo-{'ray' if backend == 'ray' else 'serve'}-1")
        start = time.monotonic()
        watcher.wait_for("watch: recovery 1 done", 900)
        return time.monotonic() - start
    finally:
        watcher.interrupt()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.day_two")
    parser.add_argument("--backend", choices=["native", "ray"], default="native")
    backend = parser.parse_args().backend
    root = DockerClient()
    print("setup: images, model, testbed (not timed)", flush=True)
    image, model = images.vllm_compile_base(root), images.tiny_model(root)
    figures: dict[str, float] = {}
    with borrowed(2) as bed:
        head, worker = clusters.place_vllm(bed, image, model)
        shutil.rmtree(WORK, ignore_errors=True)
        WORK.mkdir()
        share = " gpu_memory_utilization: 0.1," if backend == "ray" else ""
        vllm = (
            f"{{port: {PORT}, max_model_len: 256,{share} startup_timeout: 900,"
            " args: [--dtype, float32]}"
        )
        config = clusters.write_config(WORK / "daytwo.yaml", "daytwo", [head, worker], image,
                                       backend=backend, model=MODEL, vllm=vllm)  # fmt: skip
        figures["cold"] = _cold(config, head)
        remove_containers([head, worker])
        figures["warm"] = timed_up(config, head)
        print(f"warm start {figures['warm']:.1f} s", flush=True)
        figures["recovery"] = watch_recovery(config, bed, backend)
        print(f"watch recovery {figures['recovery']:.1f} s", flush=True)
        # A change that leaves vLLM's own config as it is (a vLLM argument would change the key
        # of its compile cache, and the new start would compile afresh): an added variable.
        config.write_text(config.read_text() + "env: {NCCL_DEBUG: WARN}\n")
        said = tool("upgrade", config)
        figures["upgrade"] = float(re.search(r"^downtime: ([\d.]+)s", said, re.M).group(1))  # type: ignore[union-attr]
        print(f"upgrade downtime {figures['upgrade']:.1f} s", flush=True)
        bed.power_cut([head, worker])
        for node in (head, worker):
            bed.start_engine(node)
        figures["reboot"] = serving(str(head.ip), clusters.api_key(config))
        print(f"reboot: serving {figures['reboot']:.1f} s after the engines came back", flush=True)
        tool("down", config)
    _table(figures, backend)


def _cold(config: Path, head: Node) -> float:
    tool("up", config)  # the wrapper image on both nodes (not timed)
    tool("down", config)  # removes the compile caches with the rest
    took = timed_up(config, head)
    print(f"cold start {took:.1f} s", flush=True)
    return took


def _table(f: dict[str, float], backend: str) -> None:
    print()
    print(f"day two: {backend} TP=2, 2 emulated nodes, tiny Llama, vLLM 0.32.0 CPU, compile on")
    rows = [
        ("warm start / cold start", f["warm"], f["cold"], 0.6),
        ("watch recovery / cold start", f["recovery"], f["cold"], 0.6),
        ("upgrade downtime / warm start", f["upgrade"], f["warm"], 1.1),
        ("reboot / cold start", f["reboot"], f["cold"], 1.2),
    ]
    for name, value, base, goal in rows:
        print(f"  {name:32} {value:6.1f} s / {base:6.1f} s = {value / base:.2f}  (goal <= {goal})")
    figures = [Figure("cold start", f"{f['cold']:.1f} s")]
    figures += [
        Figure(
            name,
            f"{value:.1f} s / {base:.1f} s = {value / base:.2f}",
            f"<= {goal}",
            value / base <= goal,
        )
        for name, value, base, goal in rows
    ]
    about = (
        f"Real vLLM 0.32.0 (CPU build, torch.compile on), {backend} backend, TP=2 over two"
        " emulated nodes, the tiny Llama, `watch` at its defaults; each figure to the first"
        " completion answered, all in one run. Cold: `up` after `down`; warm: `up` after the"
        " containers were removed; recovery: the worker's container killed; upgrade: an added"
        " variable; reboot: both nodes' power cut."
    )
    goals = "warm and recovery <= 0.6x cold; upgrade <= 1.1x warm; reboot <= 1.2x cold"
    record(
        "Day two: warm start, recovery, upgrade, reboot",
        about,
        goals,
        figures,
        variant="ray" if backend == "ray" else "",
    )


if __name__ == "__main__":
    main()
