"""Scale: `up` on 2, 4 and 8 emulated nodes, preflight on 8, the controller's memory during the
8-node `up`, an image sent to 7 nodes against the same image sent to 1, and one Compose call
started through `docker` against Compose started as its own binary, all in one run.

    python -m benchmarks.scale [--nodes 8]

The Ray stand-in image (tests/support/images.py: real Ray, a stand-in for vLLM, so that the
figures measure the tool, not vLLM) on emulated nodes with their own engines
(tests/support/testbed.py), images already on the nodes. Each `up` is timed after a first `up`
and `down` of the same config (the wrappers built, not timed). The controller's memory is that
of the `up` process and every process under it (its docker and compose CLIs), sampled every
0.1 s: at its peak, the RSS summed and the PSS summed (shared pages split among their
sharers), and which programs ran then. Each size is also started by hand, the floor: the
folders `up` rendered, `docker compose up -d` on every node at once, until the head answers. The
image fan-out is given the CPU seconds the machine was busy while it ran (/proc/stat): spread
over every core, the least time that work could take here.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from python_on_whales import DockerClient

from benchmarks.report import Figure, record
from generator.nodes import clients
from generator.nodes import images as distribution
from tests.support import clusters, images
from tests.support.testbed import Node, Testbed, borrowed

WORK = Path("/tmp/vllm-compose-bench-scale")


def cli(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "generator", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=WORK,
    )


Memory = tuple[int, int, str]  # RSS summed, PSS summed, what ran: "8 docker-compose, ..."


def tree_memory(pid: int) -> Memory:
    """Bytes resident in `pid` and every process under it: RSS summed (each process's shared
    pages counted in each), PSS summed (shared pages split among their sharers), and how many
    of each program ran."""
    children: dict[int, list[int]] = {}
    for status in Path("/proc").glob("[0-9]*/status"):
        with contextlib.suppress(OSError, ValueError):
            ppid = next(x for x in status.read_text().splitlines() if x.startswith("PPid:"))
            children.setdefault(int(ppid.split()[1]), []).append(int(status.parent.name))
    rss = pss = 0
    programs: collections.Counter[str] = collections.Counter()
    todo = [pid]
    while todo:
        p = todo.pop()
        todo += children.get(p, [])
        with contextlib.suppress(OSError, ValueError):
            rollup = Path(f"/proc/{p}/smaps_rollup").read_text()
            rss += int(re.search(r"^Rss:\s+(\d+)", rollup, re.M).group(1)) * 1024  # type: ignore[union-attr]
            pss += int(re.search(r"^Pss:\s+(\d+)", rollup, re.M).group(1)) * 1024  # type: ignore[union-attr]
            programs[Path(f"/proc/{p}/comm").read_text().strip()] += 1
    return rss, pss, ", ".join(f"{n} {name}" for name, n in programs.most_common())


def timed(*args: str) -> tuple[float, str, Memory]:
    """Seconds, output and peak memory (by RSS) of one command."""
    start = time.monotonic()
    proc = cli(*args)
    peak: Memory = (0, 0, "")
    while proc.poll() is None:
        peak = max(peak, tree_memory(proc.pid))
        time.sleep(0.1)
    took = time.monotonic() - start
    out = proc.stdout.read() if proc.stdout else ""
    if proc.returncode:
        raise SystemExit(f"{' '.join(args)} failed ({proc.returncode}):\n{out[-3000:]}")
    return took, out, peak


def config(nodes: list[Node], image: str) -> Path:
    path = WORK / f"scale{len(nodes)}.yaml"
    return clusters.write_config(path, f"scale{len(nodes)}", nodes, image)


def up_time(nodes: list[Node], image: str) -> tuple[float, str, Memory, float]:
    """`up` timed (its phases, its peak memory), and the same stacks started by hand."""
    path = config(nodes, image)
    timed("up", str(path))
    timed("down", str(path))
    took, out, peak = timed("up", str(path))
    timed("down", str(path))
    phases = re.search(r"^phases: (.*)$", out, re.M)
    floor = by_hand(path, nodes)
    timed("down", str(path))
    return took, phases.group(1) if phases else "?", peak, floor


def by_hand(path: Path, nodes: list[Node]) -> float:
    """The floor: the folders `up` rendered, started with plain `docker compose up -d` on every
    node at once, until the head answers a completion."""
    start = time.monotonic()
    folder = WORK / "compose" / path.stem
    starts = [
        subprocess.Popen(
            ["docker", "--context", n.context, "compose", "-f", "compose.yaml", "up", "-d"],
            cwd=folder / n.name,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for n in nodes
    ]
    if any(p.wait() for p in starts):
        raise SystemExit(f"docker compose up failed for {path.stem}")
    key = clusters.api_key(path)
    request = urllib.request.Request(
        f"http://{nodes[0].ip}:30000/v1/completions",
        json.dumps({"prompt": "hi", "max_tokens": 1}).encode(),
        {"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    while time.monotonic() - start < 300:
        with contextlib.suppress(OSError), urllib.request.urlopen(request, timeout=5) as answer:
            if json.load(answer)["choices"]:
                return time.monotonic() - start
        time.sleep(0.1)
    raise SystemExit(f"{path.stem} did not answer in 300 s when started by hand")


def compose_call(node: Node, folder: Path, runs: int = 10) -> dict[str, tuple[float, float, int]]:
    """One Compose call on a node, started through `docker` and as Compose's own binary
    (generator/nodes/clients.py), alternately: per way, the median seconds and the mean CPU
    seconds of a `compose ps`, and the bytes resident (RSS summed) in a `compose events` after a
    second."""
    binary = clients.compose_binary()
    if binary is None:
        raise SystemExit("no Compose plugin file found where the docker CLI looks")
    context, file = ["--context", node.context], ["-f", "compose.yaml"]
    ways = {
        "through docker": ["docker", *context, "compose", *file],
        "direct": [binary, *context, *file],
    }
    seconds: dict[str, list[float]] = {way: [] for way in ways}
    cpu = dict.fromkeys(ways, 0.0)
    for _ in range(runs):
        for way, command in ways.items():
            before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
            subprocess.run([*command, "ps"], cwd=folder, check=True, capture_output=True)
            seconds[way].append(time.monotonic() - start)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu[way] += after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    resident = {}
    for way, command in ways.items():
        events = subprocess.Popen([*command, "events"], cwd=folder, stdout=subprocess.DEVNULL)
        time.sleep(1)
        resident[way] = tree_memory(events.pid)[0]
        events.terminate()
        events.wait()
    return {w: (statistics.median(seconds[w]), cpu[w] / runs, resident[w]) for w in ways}


def busy() -> float:
    """CPU seconds this machine has spent busy since boot, all cores (/proc/stat)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def fan_out(bed: Testbed, image: str, count: int) -> tuple[float, float]:
    """Seconds to send `image` from the first node to `count` nodes that lack it, and the CPU
    seconds the machine was busy meanwhile (every engine's save and loads, the CLIs, this)."""
    lacking = bed.nodes[1 : 1 + count]
    for node in lacking:
        node.docker.image.remove(image, force=True)
    targets = [
        distribution.Target(n.name, DockerClient(context=n.context), WORK)
        for n in [bed.nodes[0], *lacking]
    ]
    start, cpu = time.monotonic(), busy()
    distribution.spread(targets, image, lambda line: None)
    return time.monotonic() - start, busy() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale")
    parser.add_argument("--nodes", type=int, default=8)
    largest = parser.parse_args().nodes
    sizes = [n for n in (2, 4, 8) if n < largest] + [largest]
    print(f"setup: stand-in image on {largest} emulated nodes (not timed)", flush=True)
    image = images.standin_base(DockerClient())
    with borrowed(largest) as bed:
        bed.load_image(image)
        clusters.place_standin_model(bed)
        WORK.mkdir(exist_ok=True)
        preflight, _, _ = timed("preflight", str(config(bed.nodes[:largest], image)))
        preflight, _, _ = timed("preflight", str(config(bed.nodes[:largest], image)))
        print(f"preflight on {largest} healthy nodes: {preflight:.1f} s", flush=True)
        ups = {}
        for n in sizes:
            ups[n] = up_time(bed.nodes[:n], image)
            took, phases, _, floor = ups[n]
            print(f"up on {n} nodes: {took:.1f} s ({phases}); by hand {floor:.1f} s", flush=True)
        calls = compose_call(bed.nodes[0], WORK / "compose" / f"scale{largest}" / bed.nodes[0].name)
        (one, one_cpu), (many, many_cpu) = fan_out(bed, image, 1), fan_out(bed, image, largest - 1)
        print(f"image to 1 node: {one:.1f} s; to {largest - 1}: {many:.1f} s", flush=True)
    figures = _figures(ups, sizes, preflight, (one, one_cpu), (many, many_cpu), calls)
    print("\n| figure | measured | goal |\n| --- | --- | --- |")
    for f in figures:
        print(f"| {f.figure} | {f.measured} | {f.goal} |")
    for n in sizes:
        print(f"phases of up on {n}: {ups[n][1]}")
    about = (
        "The Ray stand-in image (real Ray 2.58; a stand-in for vLLM that waits for its"
        f" placement group and answers) on {largest} emulated nodes on this machine. Floor:"
        " the rendered folders started by hand with `docker compose up -d` on every node at"
        " once. Memory: `up` and every process under it, sampled every 0.1 s."
    )
    goal = (
        f"up on {largest} <= 1.3x up on 2; preflight <= 5 s; an image to n <= 1.5x to 1; <= 200 MB"
    )
    record(f"Scale: {', '.join(map(str, sizes))} nodes", about, goal, figures)


def _figures(
    ups: dict[int, tuple[float, str, Memory, float]],
    sizes: list[int],
    preflight: float,
    to_one: tuple[float, float],
    to_many: tuple[float, float],
    calls: dict[str, tuple[float, float, int]],
) -> list[Figure]:
    largest, (one, one_cpu), (many, many_cpu) = sizes[-1], to_one, to_many
    figures = []
    for n in sizes[1:]:
        took, base = ups[n][0], ups[2][0]
        said = f"{took:.1f} s / {base:.1f} s = {took / base:.2f}"
        figures.append(Figure(f"`up` on {n} / on 2", said, "<= 1.3", took / base <= 1.3))
    for n in sizes:
        took, floor = ups[n][0], ups[n][3]
        figures.append(
            Figure(
                f"`up` on {n} / by hand on {n}",
                f"{took:.1f} s / {floor:.1f} s = {took / floor:.2f}",
            )
        )
    figures.append(
        Figure(
            f"preflight on {largest} healthy nodes", f"{preflight:.1f} s", "<= 5 s", preflight <= 5
        )
    )
    ratio = f"{many:.1f} s / {one:.1f} s = {many / one:.2f}"
    figures.append(
        Figure(f"an image to {largest - 1} nodes / to 1", ratio, "<= 1.5", many / one <= 1.5)
    )
    # The machine's floor for the fan-out: its busy CPU seconds spread over every core.
    cores = os.cpu_count() or 1
    for n, took, cpu in ((1, one, one_cpu), (largest - 1, many, many_cpu)):
        figures.append(
            Figure(f"an image to {n}: CPU busy", f"{cpu:.1f} s ({cpu / took:.2f} of {cores} cores)")
        )
    floor = max(many_cpu / cores, one)
    figures.append(
        Figure(
            f"an image to {largest - 1} / its CPU floor",
            f"{many:.1f} s / {floor:.1f} s = {many / floor:.2f}",
        )
    )
    rss, pss, programs = ups[largest][2]
    figures.append(
        Figure(
            f"the controller and its CLIs, `up` on {largest} (PSS)",
            f"{pss / 2**20:.0f} MiB",
            "<= 200 MB",
            pss <= 200e6,
        )
    )
    figures.append(
        Figure(
            "the same, RSS summed",
            f"{rss / 2**20:.0f} MiB (at the peak: {programs})",
            "<= 200 MB",
            rss <= 200e6,
        )
    )
    for way, (took, cpu, rss) in calls.items():
        said = f"{took:.2f} s, {cpu:.2f} CPU s, {rss / 2**20:.0f} MiB RSS"
        figures.append(Figure(f"a Compose call {way}", said))
    return figures


if __name__ == "__main__":
    main()
