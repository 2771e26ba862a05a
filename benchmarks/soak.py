"""A soak: `python -m benchmarks.soak [--backend native|ray|both] [--minutes 30]` (native by
default). The same cluster and load as the chaos benchmark's fault run (benchmarks/common.py),
`watch` at its defaults for the whole of it, and a fault from the list every 5 minutes (never
upgrade or rollback: they need watch stopped). At the end: every request accounted for (answered,
or failed with an error within the clients' wait, WAIT: past the front door's hold), what each
failed one saw, the group serves, and the resident memory of `watch` and of each container,
taken after a minute of load and again at the end, with its growth. Watch's lines are kept in
KEPT (BACKEND-soak.log). Bounded: the soak's minutes, then at most FAULT_LIMIT for the last fault
to heal.
"""

from __future__ import annotations

import argparse
import itertools
import time
from dataclasses import dataclass
from pathlib import Path

from python_on_whales import DockerClient

from benchmarks import common
from benchmarks.common import serving, tool
from benchmarks.report import Figure, record
from tests.support import clusters, faults
from tests.support.load import Load
from tests.support.testbed import Testbed, borrowed

EVERY = 300  # seconds between faults
FAULTS = "abcdfie"
WARM = 60  # seconds of load before the first memory reading
SHOWN = 60  # failed requests printed, at most
GROWTH = 0.10  # the goal: at most this much more resident memory at the end


@dataclass
class Soak:
    minutes: float
    faults: list[str]
    sent: int
    answered: int
    failed_clean: int
    failed_unclean: int
    failed_plain: int  # of the failed, those not streamed (the front door's goal: none)
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


def memory(bed: Testbed, watcher: common.Watcher) -> dict[str, int]:
    found = {"watch": rss(watcher.proc.pid)}
    for node in bed.nodes[:2]:
        for service, container in clusters.containers(node, "chaos").items():
            if container.state.running and container.state.pid:
                found[f"{node.name}/{service}"] = rss(container.state.pid)
    return found


def soak(bed: Testbed, backend: str, minutes: float, image: str) -> Soak:
    head = bed.nodes[0]
    config, _ = common.cold_up(bed, backend, image)
    key = clusters.api_key(config)
    url = f"http://{head.ip}:{common.PORT}/v1/chat/completions"
    seconds = minutes * 60 + common.FAULT_LIMIT + WARM  # the soak, then the last fault's wait
    load = Load(url, key, common.MODEL, timeout=common.WAIT, seconds=seconds)
    watcher, began = common.Watcher(config), time.monotonic()
    injected: list[str] = []
    last = time.monotonic()  # the last fault
    try:
        watcher.wait_for("watch: ok", 300)
        with load.running(common.CLIENTS):
            start = time.monotonic()
            time.sleep(WARM)
            before = memory(bed, watcher)
            faults = itertools.cycle(FAULTS)
            for at in range(EVERY, int(minutes * 60), EVERY):
                time.sleep(max(0.0, start + at - time.monotonic()))
                injected.append(next(faults))
                name, inject = common.FAULTS[injected[-1]]
                print(f"{backend}: soak {at / 60:.0f} min: {name}", flush=True)
                last = time.monotonic()
                inject(bed, config, backend)
            time.sleep(max(0.0, start + minutes * 60 - time.monotonic()))
            common.steady(load, last)
            after = memory(bed, watcher)
    finally:
        watcher.stop()
        common.KEPT.mkdir(exist_ok=True)  # watch's lines, kept whatever the end
        said = "".join(f"+{t - began:7.1f} s {x}\n" for t, x in watcher.lines)
        (common.KEPT / f"{backend}-soak.log").write_text(said)
    try:
        up = serving(str(head.ip), key, limit=60) >= 0
    except RuntimeError:
        up = False
    tool("down", config)
    failed = [r for r in load.done if not r.ok]
    clean = [r for r in failed if r.error and r.end - r.start <= common.WAIT + 5]
    for r in failed[:SHOWN]:  # what each client saw, and when
        kind = "streamed" if r.streamed else "plain"
        print(f"{backend}: failed at {(r.start - start) / 60:.1f} min, {kind}: {r.error[:120]}")
    growth = {what: (before[what], after[what]) for what in before if what in after}
    return Soak(minutes, injected, sum(load.sent), sum(r.ok for r in load.done), len(clean),
                len(failed) - len(clean), sum(not r.streamed for r in failed), up,
                growth)  # fmt: skip


def report(backend: str, s: Soak) -> list[str]:
    recorded = s.answered + s.failed_clean + s.failed_unclean
    lines = [
        f"{backend}: soak of {s.minutes:g} min, faults {', '.join(s.faults) or 'none'}:",
        f"  requests sent {s.sent}, recorded {recorded} (answered {s.answered}, failed with an"
        f" error {s.failed_clean}, failed otherwise {s.failed_unclean}; of the failed,"
        f" {s.failed_plain} not streamed)",
        f"  serving at the end: {'yes' if s.serving else 'NO'}",
    ]
    for what, (first, last) in sorted(s.memory.items()):
        grew = (last - first) / first if first else 0.0
        mark = "" if grew < GROWTH else f"  (over the {GROWTH:.0%} goal)"
        lines.append(
            f"  {what:14} {first / 2**20:8.0f} -> {last / 2**20:8.0f} MiB {grew:+.1%}{mark}"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak")
    parser.add_argument("--backend", choices=["native", "ray", "both"], default="native")
    parser.add_argument("--minutes", type=float, default=30, help="a fault every 5 minutes")
    args = parser.parse_args()
    backends = ["native", "ray"] if args.backend == "both" else [args.backend]
    with borrowed(2) as bed:
        image = common.prepared(bed, DockerClient())
        soaked = {b: soak(bed, b, args.minutes, image) for b in backends}
    print("\n".join(line for b, s in soaked.items() for line in report(b, s)))
    about = (f"The chaos benchmark's cluster and load for {args.minutes:g} minutes through the"
             " front door, `watch` at its defaults, a fault every 5 minutes. Every request"
             " accounted for, and the resident memory of `watch` and each container after a"
             " minute and at the end.")  # fmt: skip
    figures = [f for b, s in soaked.items() for f in _figures(b, s)]
    record("Soak", about, f"no request lost; memory growth < {GROWTH:.0%}", figures,
           variant="" if args.backend == "native" else args.backend)  # fmt: skip


def _figures(backend: str, s: Soak) -> list[Figure]:
    failed = s.failed_clean + s.failed_unclean
    figures = [
        Figure(f"{backend}: faults", ", ".join(s.faults) or "none"),
        Figure(f"{backend}: requests sent / answered", f"{s.sent:,} / {s.answered:,}"),
        Figure(f"{backend}: failed (of them plain)", f"{failed} ({s.failed_plain})",
               "no plain request fails", s.failed_plain == 0),
        Figure(f"{backend}: failed with no error (lost)", str(s.failed_unclean), "0",
               s.failed_unclean == 0),
        Figure(f"{backend}: serving at the end", "yes" if s.serving else "no", "yes", s.serving),
    ]  # fmt: skip
    for what, (first, last) in sorted(s.memory.items()):
        grew = (last - first) / first if first else 0.0
        said = f"{first / 2**20:,.0f} -> {last / 2**20:,.0f} MiB ({grew:+.1%})"
        figures.append(Figure(f"{backend}: memory of {what}", said, f"< {GROWTH:.0%}",
                              grew < GROWTH))  # fmt: skip
    return figures


if __name__ == "__main__":
    main()
