"""Faults as clients see them: real vLLM (CPU build) at its defaults (torch.compile on, as on GPUs:
the test image plus a C++ compiler), TP=2 over two emulated nodes, `watch` at its defaults (no
options, as the README runs it), and a bounded load of 4 clients, half of their requests
streamed, running through each fault in turn; the cold `up` of the same run (compile caches
empty, as after `down`) is the yardstick.

    python -m benchmarks.chaos [--backend native|ray|both] [--faults abcdefghij] [--watch-stopped]

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
import itertools
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from python_on_whales import DockerClient

from benchmarks import report
from benchmarks.common import (
    CLIENTS,
    FAULT_LIMIT,
    FAULTS,
    KEPT,
    MODEL,
    PORT,
    WAIT,
    Watcher,
    cold_up,
    prepared,
    steady,
    tool,
)  # fmt: skip
from tests.support import clusters
from tests.support.load import Load, Request
from tests.support.testbed import Testbed, borrowed

FAULT_RUN = 2 * FAULT_LIMIT  # seconds of load a fault may take in all (an upgrade, then its wait)
GOALS = {"a": 0.6, "b": 0.6, "c": 0.6, "f": 0.6, "d": 1.0, "e": 1.0, "g": 1.0, "h": 1.0}
WATCHING = True  # --watch-stopped: no watch at all
GOALS["i"] = 1.0  # no goal set for a hang; the canary alone waits group.hang_after (60 s)
GOALS["j"] = 0.6  # none set for the door; a killed container's


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
    parser.add_argument("--faults", default=FAULTS_ALL)
    stopped_help = "run the faults with no watch: what the stacks heal by themselves"
    parser.add_argument("--watch-stopped", action="store_true", help=stopped_help)
    args = parser.parse_args()
    backends = ["native", "ray"] if args.backend == "both" else [args.backend]
    global WATCHING
    WATCHING = not args.watch_stopped
    results = {}
    with borrowed(2) as bed:
        image = prepared(bed, DockerClient())
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
    variant = [] if args.faults == FAULTS_ALL else [f"faults-{args.faults}"]
    variant += [] if args.backend == "both" else [args.backend]
    variant += [] if WATCHING else ["watch-stopped"]
    report.record("Faults as clients see them", ABOUT.format(watching=watching), GOAL,
                  _figures(results), variant="-".join(variant))  # fmt: skip


ABOUT = (
    "Real vLLM (CPU build, torch.compile on), TP=2 over two emulated nodes, {watching}, 4 clients"
    " (half streamed, each waiting up to 150 s) through the front door through each fault in turn."
    " Per fault and backend: detection (the fault to watch's first line) / outage (the longest"
    " time no client got an answer; its ratio to the same run's cold `up`) / failed requests,"
    " plain + streamed."
)
GOAL = "detection <= 2 s; outage <= 0.6x (a, b, c, f) or 1.0x (d, e, g, h) a cold `up`"
FAULTS_ALL = "abcdefighj"
JUDGED = "abcdefgh"  # the faults with a goal (i and j have none set)


def _figures(results: dict[str, tuple[float, list[Figure]]]) -> list[report.Figure]:
    """A row per fault, every backend's figures in it; met where every backend met the goal."""
    rows: dict[str, list[tuple[str, Figure, float]]] = {}
    for backend, (cold, figures) in results.items():
        for f in figures:
            rows.setdefault(f.fault, []).append((backend, f, cold))
    found = []
    for fault, seen in rows.items():
        said = "; ".join(
            f"{backend} {'-' if f.detection is None else f'{f.detection:.1f} s'} /"
            f" {f.outage:.1f} s ({f.outage / cold:.2f}) / {f.failed} + {f.failed_streamed}"
            for backend, f, cold in seen
        )
        key, goal = fault[0], GOALS[fault[0]]
        met = all((f.detection or 0) <= 2 and f.outage / cold <= goal for _, f, cold in seen)
        judged = key in JUDGED
        found.append(report.Figure(fault, said, f"outage <= {goal}x cold" if judged else "",
                                   met if judged else None))  # fmt: skip
    colds = "; ".join(f"{backend} {cold:.1f} s" for backend, (cold, _) in results.items())
    return [*found, report.Figure("cold `up` (the yardstick)", colds)]


if __name__ == "__main__":
    main()
