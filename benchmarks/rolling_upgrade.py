"""A rolling upgrade from the clients' side, on real vLLM: what `upgrade` of every replica costs
the requests sent meanwhile, against the same load before it.

    python -m benchmarks.rolling_upgrade

Two replicas of the tiny model (CPU vLLM, TP=1 each, one per emulated node, one thread each)
brought up by `vllm-compose up` at its defaults. Each node's containers run on a core of their own
(tests/support/testbed.py, `pinned`), as on machines of their own: the replica that starts again
does not take the serving replica's core, as it did with both nodes on both cores. CLIENTS
clients (tests/support/load.py: half the requests streamed, each client one after another) send
chat completions through the door for BEFORE seconds, then on through `upgrade` of a changed
config (max_model_len), which drains, switches, checks and puts back each replica in turn.
Recorded: the requests during the upgrade that failed, and the longest a request took then, less
the longest in the second half of the time before it. Goals: none failed; no request waits 2 s
longer than before.

Traffic goes only to the testbed's own addresses; every loop is bounded; the processes it starts
it ends by their IDs.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from python_on_whales import DockerClient

from benchmarks.report import Figure, record
from tests.support import clusters, images
from tests.support.load import Load
from tests.support.testbed import running
from tests.test_e2e import MODEL, config
from tests.test_replicas import REPLICAS, URL

CLIENTS = 2
BEFORE = 20.0  # seconds of load before the upgrade; its second half is the usual the upgrade
# is set against (the first answers after `up` are slower: vLLM's first batches of each size)
UPGRADE_LIMIT = 900  # seconds `upgrade` may take
GOAL_WAIT = 2.0  # seconds the longest request may grow
WORK = Path("/tmp/vllm-compose-rolling")


def main() -> None:
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    with running(2, pinned=True) as bed:
        root = DockerClient()
        clusters.place_vllm(bed, images.vllm_base(root), images.tiny_model(root))
        path = config(WORK, bed, "rolling", "native", extra=REPLICAS)
        up = clusters.cli("up", path, cwd=WORK)
        if up.returncode:
            raise SystemExit(f"rolling_upgrade: up failed: {up.stderr[-2000:]}")
        path.write_text(path.read_text().replace("max_model_len: 256", "max_model_len: 200"))
        load = Load(URL, clusters.api_key(path), MODEL, seconds=BEFORE + UPGRADE_LIMIT)
        with load.running(CLIENTS):
            time.sleep(BEFORE)
            began = time.monotonic()
            rolled = clusters.cli("upgrade", path, cwd=WORK, timeout=UPGRADE_LIMIT)
            ended = time.monotonic()
        clusters.cli("down", path, cwd=WORK)
    if rolled.returncode:
        raise SystemExit(f"rolling_upgrade: upgrade failed: {rolled.stderr[-2000:]}")
    before = [r for r in load.done if began - BEFORE / 2 <= r.start and r.end < began]
    during = [r for r in load.done if r.end >= began and r.start <= ended]
    failed = [r for r in during if not r.ok]
    longest = max(r.end - r.start for r in before), max(r.end - r.start for r in during)
    grew = longest[1] - longest[0]
    print(f"before: {len(before)} requests, the longest {longest[0]:.2f} s; during the upgrade"
          f" ({ended - began:.0f} s): {len(during)}, {len(failed)} failed, the longest"
          f" {longest[1]:.2f} s ({grew:+.2f} s)")  # fmt: skip
    figures = [
        Figure("requests during the upgrade that failed", f"{len(failed)} of {len(during)}",
               "0", not failed),
        Figure("the longest request during it, against before", f"{grew:+.2f} s"
               f" ({longest[1]:.2f} s against {longest[0]:.2f} s)", f"<= +{GOAL_WAIT:g} s",
               grew <= GOAL_WAIT),
        Figure("the upgrade of both replicas took", f"{ended - began:.0f} s"),
    ]  # fmt: skip
    about = (f"Two replicas of the tiny model (CPU vLLM, one thread each, each node on a core of"
             f" its own) behind the door at its defaults; {CLIENTS} clients, half the requests"
             f" streamed, for {BEFORE:g} s and then through `upgrade` of a changed max_model_len,"
             " replica by replica.")  # fmt: skip
    record("A rolling upgrade, from the clients' side", about,
           f"0 failed; the longest request +{GOAL_WAIT:g} s at most", figures)  # fmt: skip


if __name__ == "__main__":
    main()
