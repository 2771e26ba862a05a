"""Scale: `up` on 2, 4 and 8 emulated nodes, preflight on 8, the controller's memory during the
8-node `up`, and an image sent to 7 nodes against the same image sent to 1, all in one run.

    python -m benchmarks.scale [--nodes 8]

The Ray stand-in image (tests/support/images.py: real Ray, a stand-in for vLLM, so that the
figures measure the tool, not vLLM) on emulated nodes with their own engines
(tests/support/testbed.py), images already on the nodes. Each `up` is timed after a first `up`
and `down` of the same config (the wrappers built, not timed). The controller's memory is the
resident set of the `up` process and every process under it (its docker and compose CLIs),
sampled every 0.1 s; its peak is printed.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

from python_on_whales import DockerClient

from generator import images as distribution
from tests.support import clusters, images
from tests.support.testbed import STATE, Node, Testbed

WORK = Path("/tmp/vllm-compose-bench-scale")


def cli(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "generator", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def tree_rss(pid: int) -> int:
    """Bytes resident in `pid` and every process under it."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(
                line.split(":", 1) for line in status.read_text().splitlines() if ":" in line
            )
        except OSError:
            continue
        me = int(status.parent.name)
        children.setdefault(int(fields.get("PPid", "0")), []).append(me)
        rss[me] = int(fields.get("VmRSS", "0 kB").split()[0]) * 1024
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        total += rss.get(p, 0)
        todo += children.get(p, [])
    return total


def timed(*args: str) -> tuple[float, str, int]:
    """Seconds, output and peak memory of one command."""
    start = time.monotonic()
    proc = cli(*args)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, tree_rss(proc.pid))
        time.sleep(0.1)
    took = time.monotonic() - start
    out = proc.stdout.read() if proc.stdout else ""
    if proc.returncode:
        raise SystemExit(f"{' '.join(args)} failed ({proc.returncode}):\n{out[-3000:]}")
    return took, out, peak


def config(nodes: list[Node], image: str) -> Path:
    path = WORK / f"scale{len(nodes)}.yaml"
    return clusters.write_config(path, f"scale{len(nodes)}", nodes, image)


def up_time(nodes: list[Node], image: str) -> tuple[float, str, int]:
    path = str(config(nodes, image))
    timed("up", path)
    timed("down", path)
    took, out, peak = timed("up", path)
    timed("down", path)
    phases = re.search(r"^phases: (.*)$", out, re.M)
    return took, phases.group(1) if phases else "?", peak


def fan_out(bed: Testbed, image: str, count: int) -> float:
    """Seconds to send `image` from the first node to `count` nodes that lack it."""
    lacking = bed.nodes[1 : 1 + count]
    for node in lacking:
        node.docker.image.remove(image, force=True)
    targets = [
        distribution.Target(n.name, DockerClient(context=n.context), WORK)
        for n in [bed.nodes[0], *lacking]
    ]
    start = time.monotonic()
    distribution.spread(targets, image, lambda line: None)
    return time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale")
    parser.add_argument("--nodes", type=int, default=8)
    largest = parser.parse_args().nodes
    sizes = [n for n in (2, 4, 8) if n < largest] + [largest]
    print(f"setup: stand-in image on {largest} emulated nodes (not timed)", flush=True)
    image = images.standin_base(DockerClient())
    own = not (STATE / "testbed.json").exists()
    bed = Testbed.create(largest) if own else Testbed.load()
    try:
        bed.load_image(image)
        clusters.place_standin_model(bed)
        WORK.mkdir(exist_ok=True)
        preflight, _, _ = timed("preflight", str(config(bed.nodes[:largest], image)))
        preflight, _, _ = timed("preflight", str(config(bed.nodes[:largest], image)))
        print(f"preflight on {largest} healthy nodes: {preflight:.1f} s", flush=True)
        ups = {}
        for n in sizes:
            ups[n] = up_time(bed.nodes[:n], image)
            print(f"up on {n} nodes: {ups[n][0]:.1f} s ({ups[n][1]})", flush=True)
        one = fan_out(bed, image, 1)
        many = fan_out(bed, image, largest - 1)
        print(f"image to 1 node: {one:.1f} s; to {largest - 1}: {many:.1f} s", flush=True)
    finally:
        if own:
            bed.destroy()
    print()
    print("| figure | measured | goal |")
    print("| --- | --- | --- |")
    for n in sizes[1:]:
        took, base = ups[n][0], ups[2][0]
        print(f"| up on {n} / up on 2 | {took:.1f} s / {base:.1f} s = {took / base:.2f} | <= 1.3 |")
    print(f"| preflight on {largest} healthy nodes | {preflight:.1f} s | <= 5 s |")
    ratio = f"{many:.1f} s / {one:.1f} s = {many / one:.2f}"
    print(f"| image to {largest - 1} nodes / to 1 | {ratio} | <= 1.5 |")
    peak = ups[largest][2]
    print(f"| controller memory, up on {largest} | {peak / 2**20:.0f} MiB peak | <= 200 MB |")
    for n in sizes:
        print(f"phases of up on {n}: {ups[n][1]}")


if __name__ == "__main__":
    main()
