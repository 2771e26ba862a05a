"""Copy the model from one node to the others, node to node over the private link.

The controller only orchestrates: a sender container on the source node serves the files
(symlinks followed, so an HF cache's snapshot arrives as real files) on its private IP; one
receiver container per target, all at once, fetches what it lacks and checks every file against the
manifest (size and sha256) before it takes its place. Correct files are kept, so a second run moves
nothing; a copy that fails any check never reports success.
"""

from __future__ import annotations

import contextlib
import json
import random
import subprocess
import threading
import time
from dataclasses import dataclass

from python_on_whales import DockerClient, DockerException

from generator import units
from generator.config import Cluster, Node
from generator.errors import DockerError
from generator.fanout import Report, last_line
from generator.stack import model_mount


@dataclass
class Outcome:
    moved: int = 0
    kept: int = 0
    error: str | None = None


def sync(
    cluster: Cluster,
    docker: dict[str, DockerClient],
    source: Node,
    manifest: dict[str, object],
    image: str,
    report: Report,
) -> dict[str, Outcome]:
    path = cluster.model.path
    port = random.randint(49000, 49999)
    listen = f"{source.ip}:{port}"
    mount = model_mount(path)
    try:
        sender = docker[source.name].run(
            image,
            ["send", "--root", path, "--listen", listen],
            entrypoint="vllm-compose-health",
            detach=True,
            remove=True,
            networks=["host"],
            volumes=[(mount, mount, "ro")],
            labels={"io.vllm-compose.cluster": cluster.name, "io.vllm-compose.role": "sync"},
        )
    except DockerException as e:
        raise DockerError(source.name, f"the model sender failed: {last_line(e.stderr)}") from None
    targets = [n for n in cluster.nodes if n != source]
    outcomes = {n.name: Outcome() for n in targets}
    try:  # the receivers start at once: they retry until the sender listens
        threads = [
            threading.Thread(
                target=_receive,
                args=(docker[n.name], n, image, path, listen, manifest, outcomes[n.name], report),
                daemon=True,
            )
            for n in targets
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        with contextlib.suppress(DockerException):
            docker[source.name].container.remove(sender.id, force=True)
    return outcomes


def _receive(
    docker: DockerClient,
    node: Node,
    image: str,
    path: str,
    listen: str,
    manifest: dict[str, object],
    outcome: Outcome,
    report: Report,
) -> None:
    cmd = [*map(str, docker.client_config.docker_cmd), "run", "--rm", "-i", "--network", "host"]
    cmd += ["-v", f"{path}:{path}", "--entrypoint", "vllm-compose-health", image]
    cmd += ["receive", "--root", path, "--source", listen]
    receiver = subprocess.Popen(
        cmd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert receiver.stdin and receiver.stdout and receiver.stderr
    receiver.stdin.write(json.dumps(manifest))
    receiver.stdin.close()
    total = sum(f["size"] for f in manifest["files"].values())  # type: ignore[attr-defined]
    last = 0.0
    for line in receiver.stdout:
        event = json.loads(line)
        if event.get("done"):
            outcome.moved, outcome.kept = event["moved"], event["kept"]
        elif time.monotonic() - last > 2:
            moved = units.size(event["moved"])
            report(f"sync-model: {node.name}: {moved} of up to {units.size(total)}")
            last = time.monotonic()
    error = receiver.stderr.read()
    if receiver.wait() != 0:
        outcome.error = last_line(error)
