"""What the benchmarks on the testbed share: the tool run as a user runs it, the wait for a
completion, and for the fault benchmarks (chaos and soak) their cluster, load, faults and `watch`.
Every loop here is bounded in count and time; traffic goes only to the testbed's own addresses."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from python_on_whales import DockerClient

from tests.support import clusters, faults, images
from tests.support.load import Load
from tests.support.testbed import MODELS, Testbed

MODEL = f"{MODELS}/{images.MODEL}"
PORT = 30000
WORK = Path("/tmp/vllm-compose-chaos")  # the fault benchmarks' config
KEPT = Path("/tmp/vllm-compose-chaos-watch")  # each fault's watch lines, kept after the run
STEADY = 10  # seconds of answers in a row that end a fault's wait
GAP = 3  # seconds: the longest silence those may hold (4 clients get several answers a second)
CLIENTS = 4
WAIT = 150  # seconds a client waits for its answer: past the front door's hold (120 s)
FAULT_LIMIT = 600  # seconds a fault may take to serve again before the run gives up on it
FAULT_RUN = 2 * FAULT_LIMIT  # seconds of load a fault may take in all (an upgrade, then its wait)
LINK_CUT = 20


def serving(ip: str, key: str, limit: float = 900) -> float:
    """Seconds until a completion comes back."""
    start = time.monotonic()
    body = json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 1}).encode()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    while time.monotonic() - start < limit:
        request = urllib.request.Request(f"http://{ip}:{PORT}/v1/completions", body, headers)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                if json.load(response)["choices"]:
                    return time.monotonic() - start
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"no completion from {ip} in {limit:g} s")


def tool(*args: str | Path) -> str:
    done = subprocess.run([sys.executable, "-m", "generator", *map(str, args)],
                          capture_output=True, text=True, check=False)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"vllm-compose {args[0]} failed:\n{done.stderr}")
    return done.stdout


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


def prepared(bed: Testbed, root: DockerClient) -> str:
    """The test image and the tiny model on the first two nodes (not timed); the image's name."""
    print("setup: images, model, testbed (not timed)", flush=True)
    image, model = images.vllm_compile_base(root), images.tiny_model(root)
    bed.load_image(image, nodes=bed.nodes[:2])
    for node in bed.nodes[:2]:
        shutil.copytree(model, Path(node.models) / images.MODEL, dirs_exist_ok=True)
    return image
