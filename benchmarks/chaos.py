"""Faults as clients see them: real vLLM (CPU build) at its defaults (torch.compile on, as on GPUs:
the test image plus a C++ compiler), TP=2 over two emulated nodes, `watch` at its defaults (no
options, as the README runs it), and a bounded load of 4 clients, half of their requests
streamed, running through each fault in turn; the cold `up` of the same run (compile caches
empty, as after `down`) is the yardstick.

    python -m benchmarks.chaos [--backend native|ray|both] [--faults abcdefghij] [--watch-stopped]
                               [--soak MINUTES]

Faults: a. the worker's process crashes (its container's first process killed from outside
the engine: Docker starts the container again); b. the worker's serve (native) or Ray (ray)
container killed with `docker kill`; c. the head's serve container killed; d. the worker's
power cut (engine and containers killed, then the engine started); e. both nodes' power cut;
f. the link between the nodes down for 20 s; g. `upgrade` to a changed config (an added
variable; watch stopped meanwhile, as two controllers must not act at once); h. `rollback`;
i. the worker's rank hung (its processes stopped with SIGSTOP; container and supervisor stay);
j. the head's front door killed with `docker kill` (the group itself untouched).

The clients send to the endpoint, the front door (on by default), and each waits up to 150 s for
its answer (past the door's hold, 120 s). Per fault: time to detection (the fault to watch's
first line about it), the outage clients saw (the longest time in which none of them got an
answer, their requests failing or held meanwhile), failed requests (streamed and not), the
longest an answered request was held, who healed it, and the ratio of the outage to the cold
`up`. Goals: detection <= 2 s; outage <= 0.6x cold for a, b, c and f, <= 1.0x for d, e, g and h.
Watch's lines of each fault are kept in /tmp/vllm-compose-chaos-watch. Every load and fault loop
is bounded in count and time; traffic goes only to the testbed's own addresses.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from python_on_whales import DockerClient

from benchmarks.day_two import serving, tool
from tests.support import clusters, faults, images
from tests.support.load import Load, Request
from tests.support.testbed import MODELS, Testbed, borrowed

MODEL = f"{MODELS}/{images.MODEL}"
PORT = 30000
WORK = Path("/tmp/vllm-compose-chaos")
KEPT = Path("/tmp/vllm-compose-chaos-watch")  # each fault's watch lines, kept after the run
STEADY = 10  # seconds of answers in a row that end a fault's wait
GAP = 3  # seconds: the longest silence those may hold (4 clients get several answers a second)
CLIENTS = 4
WAIT = 150  # seconds a client waits for its answer: past the front door's hold (120 s)
FAULT_LIMIT = 600  # seconds a fault may take to serve again before the run gives up on it
FAULT_RUN = 2 * FAULT_LIMIT  # seconds of load a fault may take in all (an upgrade, then its wait)
LINK_CUT = 20
GOALS = {"a": 0.6, "b": 0.6, "c": 0.6, "f": 0.6, "d": 1.0, "e": 1.0, "g": 1.0, "h": 1.0}
WATCHING = True  # --watch-stopped: no watch at all
GOALS["i"] = 1.0  # no goal set for a hang; the canary alone waits group.hang_after (60 s)
GOALS["j"] = 0.6  # none set for the door; a killed container's


class Watcher:
    """`vllm-compose watch CONFIG` at its defaults, each line kept with when it came."""

    def __init__(self, config: Path) -> None:
        cmd = [sys.executable, "-m", "generator", "watch", str(config)]
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            cwd=config.parent,
        )
        self.lines: list[tuple[float, str]] = []
        self.new: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))
            self.new.put(line)

    def wait_for(self, text: str, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            with contextlib.suppress(queue.Empty):
                if text in self.new.get(timeout=1):
                    return
        raise RuntimeError(f"watch never said {text!r}:\n" + "\n".join(x for _, x in self.lines))

    def since(self, moment: float) -> list[tuple[float, str]]:
        return [(t, x) for t, x in self.lines if t >= moment]

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@dataclass
class Figure:
    fault: str
    detection: float | None  # seconds; None where watch had no part
    outage: float
    failed: int
    failed_streamed: int
    healer: str
    held: float = 0.0  # seconds: the longest wait of an answered request (the front door holds)
    errors: dict[str, int] = field(default_factory=dict)  # what the failed requests saw: count


def measured(
    name: str, detection: float | None, healer: str, done: list[Request], at: float
) -> Figure:
    """The fault's figure from the requests that ended after `at`."""
    lost, plain, streamed = outage(done, at)
    seen = Counter(
        f"{'streamed' if r.streamed else 'plain'}: {r.error[:160]}"
        for r in done
        if r.end >= at and not r.ok
    )
    return Figure(name, detection, lost, plain, streamed, healer, held(done, at), dict(seen))


def outage(done: list[Request], since: float) -> tuple[float, int, int]:
    """(the longest time after `since` in which no client got an answer, failed plain, failed
    streamed). Behind the front door a request is held, not failed: the outage is the silence
    clients lived through, whether their requests failed meanwhile or waited."""
    after = [r for r in done if r.end >= since]
    failed = [r for r in after if not r.ok]
    answered = sorted(r.end for r in after if r.ok)
    ends = [since, *answered] if answered else [since, time.monotonic()]
    longest = max(b - a for a, b in itertools.pairwise(ends))
    return longest, sum(not r.streamed for r in failed), sum(r.streamed for r in failed)


def held(done: list[Request], since: float) -> float:
    """The longest an answered request that ended after `since` waited for its answer."""
    return max((r.end - r.start for r in done if r.ok and r.end >= since), default=0.0)


def steady(load: Load, since: float) -> None:
    """Until STEADY seconds of answers in a row after `since`: every request that ended in them
    answered, and no GAP without an answer (a few requests that were near their end when a rank
    hung are not a group serving again); bounded by FAULT_LIMIT."""
    deadline = since + FAULT_LIMIT
    while time.monotonic() < deadline:
        time.sleep(1)
        if bound := load.spent():
            raise RuntimeError(f"{bound} was met {time.monotonic() - since:.0f} s after the"
                               " fault: no request is sent after it")  # fmt: skip
        now = time.monotonic()
        if now - since < STEADY:
            continue
        recent = [r for r in load.done if r.end >= now - STEADY]
        ends = [now - STEADY, *sorted(r.end for r in recent), now]
        gaps = max(b - a for a, b in itertools.pairwise(ends))
        if recent and all(r.ok for r in recent) and gaps <= GAP:
            return
    raise RuntimeError(f"not serving steadily {FAULT_LIMIT} s after the fault")


def healer(lines: list[str]) -> str:
    text = "\n".join(lines)
    if found := re.search(r"healed by (.+) in \d+ s", text):
        return found[1]
    if "recovery" in text and "done: serving again" in text:
        return "watch (recreate)"
    if re.search(r"watch: .* started again$", text, re.MULTILINE):
        return "watch (started it again alone)"
    return "the stacks themselves"


def detection(lines: list[tuple[float, str]], at: float) -> float | None:
    said = [t for t, x in lines if "watch:" in x and not re.search(r"watch: (ok|stopped)", x)]
    return said[0] - at if said else None


Fault = Callable[[Testbed, Path, str], None]


def crash(bed: Testbed, config: Path, backend: str) -> None:
    service = "ray" if backend == "ray" else "serve"
    os.kill(faults.first_process(bed.nodes[1], "chaos", service), signal.SIGKILL)


def kill_worker(bed: Testbed, config: Path, backend: str) -> None:
    service = "ray" if backend == "ray" else "serve"
    bed.nodes[1].docker.container.kill(clusters.containers(bed.nodes[1], "chaos")[service])


def kill_head_serve(bed: Testbed, config: Path, backend: str) -> None:
    bed.nodes[0].docker.container.kill(clusters.containers(bed.nodes[0], "chaos")["serve"])


def power_worker(bed: Testbed, config: Path, backend: str) -> None:
    bed.power_cut([bed.nodes[1]])
    bed.start_engine(bed.nodes[1])


def power_both(bed: Testbed, config: Path, backend: str) -> None:
    bed.power_cut(bed.nodes[:2])
    for node in bed.nodes[:2]:
        bed.start_engine(node)


def kill_door(bed: Testbed, config: Path, backend: str) -> None:
    bed.nodes[0].docker.container.kill(clusters.containers(bed.nodes[0], "chaos")["front-door"])


def hang_worker(bed: Testbed, config: Path, backend: str) -> None:
    faults.hang_rank(bed.nodes[1], "chaos", backend)


def link_cut(bed: Testbed, config: Path, backend: str) -> None:
    bed.link_down(bed.nodes[1])
    time.sleep(LINK_CUT)
    bed.link_up(bed.nodes[1])


FAULTS: dict[str, tuple[str, Fault]] = {
    "a": ("a. worker's process crashes", crash),
    "b": ("b. worker's container killed", kill_worker),
    "c": ("c. head's serve killed", kill_head_serve),
    "d": ("d. worker's power cut", power_worker),
    "e": ("e. both nodes' power cut", power_both),
    "f": (f"f. link cut {LINK_CUT} s", link_cut),
    "i": ("i. worker's rank hung", hang_worker),
    "j": ("j. head's front door killed", kill_door),
}
RELEASES = {"g": "g. upgrade", "h": "h. rollback"}


def one_backend(bed: Testbed, backend: str, faults: str, image: str) -> tuple[float, list[Figure]]:
    head, worker = bed.nodes[:2]
    config, cold = cold_up(bed, backend, image)
    figures = []
    url = f"http://{head.ip}:{PORT}/v1/chat/completions"  # the front door (on by default)
    # Each client waits as an agent would; the load lasts as long as every fault may take.
    load = Load(url, clusters.api_key(config), MODEL, timeout=WAIT, seconds=FAULT_RUN * len(faults))
    with load.running(CLIENTS):
        for key in faults:
            figures.append(_fault(bed, config, backend, key, load))
            print(f"{backend}: {_row(figures[-1], cold)}", flush=True)
    tool("down", config)
    left = clusters.leftovers(head, "chaos") + clusters.leftovers(worker, "chaos")
    print(f"{backend}: left behind after down: {left or 'nothing'}", flush=True)
    return cold, figures


def cold_up(bed: Testbed, backend: str, image: str) -> tuple[Path, float]:
    """The run's config (TP=2 over the first two nodes), and its cold `up` in seconds (up to the
    first completion), the wrapper image built on both nodes beforehand (not timed)."""
    head, worker = bed.nodes[:2]
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir()
    share = " gpu_memory_utilization: 0.1," if backend == "ray" else ""
    args = "args: [--dtype, float32]"
    vllm = f"{{port: {PORT}, max_model_len: 256,{share} startup_timeout: 900, {args}}}"
    config = clusters.write_config(WORK / "chaos.yaml", "chaos", [head, worker], image,
                                   backend=backend, model=MODEL, vllm=vllm)  # fmt: skip
    tool("up", config)  # the wrapper image on both nodes (not timed)
    tool("down", config)
    start = time.monotonic()
    tool("up", config)
    serving(str(head.ip), clusters.api_key(config))
    cold = time.monotonic() - start
    print(f"{backend}: cold up {cold:.1f} s", flush=True)
    return config, cold


def _fault(bed: Testbed, config: Path, backend: str, key: str, load: Load) -> Figure:
    if key in RELEASES:
        at = time.monotonic()
        if key == "g":
            config.write_text(config.read_text() + "env: {NCCL_DEBUG: WARN}\n")
            tool("upgrade", config)
        else:
            tool("rollback", config)
        steady(load, at)
        return measured(RELEASES[key], None, f"`{RELEASES[key][3:]}`", load.done, at)
    name, inject = FAULTS[key]
    if not WATCHING:  # what heals with no controller: the stacks' own restarts and supervisors
        at = time.monotonic()
        inject(bed, config, backend)
        steady(load, at)
        return measured(name, None, "the stacks themselves (watch stopped)", load.done, at)
    watcher = Watcher(config)
    try:
        watcher.wait_for("watch: ok", 300)
        time.sleep(2)  # the event streams are open
        at = time.monotonic()
        inject(bed, config, backend)
        steady(load, at)
        time.sleep(2)  # watch's last line about it
    finally:
        watcher.stop()
    lines = watcher.since(at)
    KEPT.mkdir(exist_ok=True)
    said = "".join(f"+{t - at:6.1f} s {x}\n" for t, x in lines)
    (KEPT / f"{backend}-{key}.log").write_text(said)
    return measured(name, detection(lines, at), healer([x for _, x in lines]), load.done, at)


def _row(f: Figure, cold: float) -> str:
    found = "-" if f.detection is None else f"{f.detection:.1f} s"
    goal = GOALS[f.fault[0]]
    ratio = f.outage / cold
    return (f"{f.fault:30} detection {found:>7}  outage {f.outage:5.1f} s = {ratio:.2f}x cold"
            f" (goal <= {goal})  failed {f.failed} + {f.failed_streamed} streamed  held up to"
            f" {f.held:.1f} s  healed by"
            f" {f.healer}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.chaos")
    parser.add_argument("--backend", choices=["native", "ray", "both"], default="both")
    parser.add_argument("--faults", default="abcdefighj")
    stopped_help = "run the faults with no watch: what the stacks heal by themselves"
    parser.add_argument("--watch-stopped", action="store_true", help=stopped_help)
    soak_help = "instead: a soak, a fault every 5 minutes (30 for the figure)"
    parser.add_argument("--soak", type=float, metavar="MINUTES", help=soak_help)
    args = parser.parse_args()
    backends = ["native", "ray"] if args.backend == "both" else [args.backend]
    global WATCHING
    WATCHING = not args.watch_stopped
    root = DockerClient()
    print("setup: images, model, testbed (not timed)", flush=True)
    image, model = images.vllm_compile_base(root), images.tiny_model(root)
    results = {}
    with borrowed(2) as bed:
        bed.load_image(image, nodes=bed.nodes[:2])
        for node in bed.nodes[:2]:
            shutil.copytree(model, Path(node.models) / images.MODEL, dirs_exist_ok=True)
        if args.soak:
            from benchmarks.soak import report, soak

            soaked = {b: soak(bed, b, args.soak, image) for b in backends}
            print("\n".join(line for b, s in soaked.items() for line in report(b, s)))
            return
        for backend in backends:
            results[backend] = one_backend(bed, backend, args.faults, image)
    print()
    watching = "watch at its defaults" if WATCHING else "watch stopped"
    print(f"chaos: TP=2, 2 emulated nodes, tiny Llama, vLLM CPU, {watching}, "
          f"{CLIENTS} clients (half streamed)")  # fmt: skip
    for backend, (cold, figures) in results.items():
        print(f"{backend} (cold up {cold:.1f} s):")
        for f in figures:
            print(f"  {_row(f, cold)}")
            for seen, count in sorted(f.errors.items(), key=lambda e: -e[1])[:4]:
                print(f"      {count} x {seen}")


if __name__ == "__main__":
    main()
