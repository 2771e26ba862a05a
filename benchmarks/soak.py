"""The chaos benchmark's soak (`python -m benchmarks.chaos --soak MINUTES`): the same cluster and
load as the fault run, `watch` at its defaults for the whole of it, and a fault from the list
every 5 minutes (never upgrade or rollback: they need watch stopped). At the end: every request
accounted for (answered, or failed with an error within the clients' timeout), the group serves,
and the resident memory of `watch` and of each container, taken after a minute of load and again
at the end, with its growth. Bounded: the soak's minutes, then at most FAULT_LIMIT for the last
fault to heal.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks import chaos
from benchmarks.day_two import serving, tool
from tests.support import clusters, faults
from tests.support.load import REQUEST_TIMEOUT, Load
from tests.support.testbed import Testbed

EVERY = 300  # seconds between faults
FAULTS = "abcdfie"
WARM = 60  # seconds of load before the first memory reading
GROWTH = 0.10  # the goal: at most this much more resident memory at the end


@dataclass
class Soak:
    minutes: float
    faults: list[str]
    sent: int
    answered: int
    failed_clean: int
    failed_unclean: int
    serving: bool
    memory: dict[str, tuple[int, int]]  # what -> (bytes after WARM, bytes at the end)


def rss(pid: int) -> int:
    """Resident bytes of a process and everything under it."""
    total = 0
    for one in [pid, *faults.descendants(pid)]:
        try:
            status = Path(f"/proc/{one}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) * 1024
    return total


def memory(bed: Testbed, watcher: chaos.Watcher) -> dict[str, int]:
    found = {"watch": rss(watcher.proc.pid)}
    for node in bed.nodes[:2]:
        for service, container in clusters.containers(node, "chaos").items():
            if container.state.running and container.state.pid:
                found[f"{node.name}/{service}"] = rss(container.state.pid)
    return found


def soak(bed: Testbed, backend: str, minutes: float, image: str) -> Soak:
    head = bed.nodes[0]
    config, _ = chaos.cold_up(bed, backend, image)
    key = clusters.api_key(config)
    load = Load(f"http://{head.ip}:{chaos.PORT}/v1/chat/completions", key, chaos.MODEL)
    watcher = chaos.Watcher(config)
    injected: list[str] = []
    last = time.monotonic()  # the last fault
    try:
        watcher.wait_for("watch: ok", 300)
        with load.running(chaos.CLIENTS):
            start = time.monotonic()
            time.sleep(WARM)
            before = memory(bed, watcher)
            faults = itertools.cycle(FAULTS)
            for at in range(EVERY, int(minutes * 60), EVERY):
                time.sleep(max(0.0, start + at - time.monotonic()))
                injected.append(next(faults))
                name, inject = chaos.FAULTS[injected[-1]]
                print(f"{backend}: soak {at / 60:.0f} min: {name}", flush=True)
                last = time.monotonic()
                inject(bed, config, backend)
            time.sleep(max(0.0, start + minutes * 60 - time.monotonic()))
            chaos.steady(load, last)
            after = memory(bed, watcher)
    finally:
        watcher.stop()
    try:
        up = serving(str(head.ip), key, limit=60) >= 0
    except RuntimeError:
        up = False
    tool("down", config)
    failed = [r for r in load.done if not r.ok]
    clean = [r for r in failed if r.error and r.end - r.start <= REQUEST_TIMEOUT + 5]
    growth = {what: (before[what], after[what]) for what in before if what in after}
    return Soak(minutes, injected, sum(load.sent), sum(r.ok for r in load.done), len(clean),
                len(failed) - len(clean), up, growth)  # fmt: skip


def report(backend: str, s: Soak) -> list[str]:
    recorded = s.answered + s.failed_clean + s.failed_unclean
    lines = [
        f"{backend}: soak of {s.minutes:g} min, faults {', '.join(s.faults) or 'none'}:",
        f"  requests sent {s.sent}, recorded {recorded} (answered {s.answered}, failed with an"
        f" error {s.failed_clean}, failed otherwise {s.failed_unclean})",
        f"  serving at the end: {'yes' if s.serving else 'NO'}",
    ]
    for what, (first, last) in sorted(s.memory.items()):
        grew = (last - first) / first if first else 0.0
        mark = "" if grew < GROWTH else f"  (over the {GROWTH:.0%} goal)"
        lines.append(
            f"  {what:14} {first / 2**20:8.0f} -> {last / 2**20:8.0f} MiB {grew:+.1%}{mark}"
        )
    return lines
