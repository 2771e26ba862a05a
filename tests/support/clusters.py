"""Helpers for tests that deploy on the testbed: a config for some of its nodes, the CLI as a user
runs it, and the containers a project left on a node."""

from __future__ import annotations

import json
import os
import queue
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path
from typing import Any

from python_on_whales import Container, DockerClient

from tests.support import images
from tests.support.testbed import IFNAME, MODELS, Node, Testbed

# A test's testbed and its own folder (the fixtures named `pair` and `stack`).
Pair = tuple[Testbed, Path]

# What the Ray STAND-IN serves (it loads nothing): a model folder with a file, on every node, so
# preflight's model check has something to compare.
STANDIN_MODEL = f"{MODELS}/standin-model"
# Prometheus and the node exporter from Debian's packages (tests/support/images.py), scraping each
# second, so that a test sees every target within seconds.
METRICS = (
    f"metrics: {{prometheus_image: {images.PROMETHEUS}, node_exporter_image: {images.NODE_EXPORTER},"
    f" mtail_image: {images.MTAIL}, scrape_interval: 1}}"
)


def load_metrics(bed: Testbed, nodes: list[Node] | None = None) -> None:
    """METRICS' three images, built from Debian's packages on the root engine, into every node
    (or those given) that lacks them."""
    for tag in (images.PROMETHEUS, images.NODE_EXPORTER, images.MTAIL):
        bed.load_image(images.metrics_image(DockerClient(), tag), nodes=nodes)


def place_standin_model(bed: Testbed) -> None:
    for node in bed.nodes:
        folder = Path(node.models) / "standin-model"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text('{"model_type": "stand-in"}\n')
        (folder / "weights.bin").write_bytes(bytes(4096))


def place_vllm(bed: Testbed, image: str, model: Path) -> tuple[Node, Node]:
    """The real-vLLM image and the tiny model on the first two nodes; (head, worker)."""
    head, worker = bed.nodes[:2]
    bed.load_image(image, nodes=[head, worker])
    for node in (head, worker):
        shutil.copytree(model, Path(node.models) / images.MODEL, dirs_exist_ok=True)
    return head, worker


def write_config(
    path: Path,
    name: str,
    nodes: list[Node],
    image: str,
    contexts: list[str] | None = None,
    backend: str = "ray",
    model: str = STANDIN_MODEL,
    vllm: str = "{port: 30000}",
    extra: str = "",
    interfaces: list[str] | None = None,
    door: str = "",
) -> Path:
    """`interfaces`: each node's own interface name (default: IFNAME for all, at the top level);
    `door`: more of `front_door`'s settings ("requests_per_minute: 3")."""
    contexts = contexts or [n.context for n in nodes]
    own = [f", interface: {i}" for i in interfaces] if interfaces else [""] * len(nodes)
    lines = [
        f"name: {name}",
        f"image: {image}",
        f"backend: {backend}",
        "accelerator: none",
        f"interface: {IFNAME}",
        "nodes:",
        *(
            f"  - {{name: {n.name}, ip: {n.ip}, context: {c}{i}}}"
            for n, c, i in zip(nodes, contexts, own, strict=True)
        ),
        f"model: {{path: {model}}}",
        f"vllm: {vllm}",
        # Debian's HAProxy in place of the official image.
        f"front_door: {{image: {images.HAPROXY}{', ' + door if door else ''}}}",
        *([extra] if extra else []),
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def api_key(config: Path) -> str:
    """The API key `up` generated in the config's state folder."""
    return state(config, "api-key").read_text().strip()


def state(config: Path, name: str) -> Path:
    """A file or folder of the config's state folder (CONFIG-STEM.state/)."""
    return config.parent / f"{config.stem}.state" / name


def completion_from(node: Node, url: str, config: Path) -> dict[str, Any]:
    """A completion of one token asked from `node` with the config's key, as a client there."""
    auth = f"Authorization: Bearer {api_key(config)}"
    body = '{"prompt": "hi", "max_tokens": 1}'
    out = node.nsexec("curl", "-sf", "-m", "10", url, "-H", auth, "-d", body)
    return dict(json.loads(out.stdout))


def cli(*args: str | Path, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "generator", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )


class Background:
    """The CLI running on its own (`up --watch`, `watch`, a slow `up`), its stderr and stdout
    lines read as they come."""

    def __init__(self, *args: str | Path, cwd: Path, sigint_ignored: bool = False) -> None:
        cmd = [sys.executable, "-m", "generator", *map(str, args)]
        if sigint_ignored:  # as a shell starts a background job: the CLI inherits SIG_IGN
            cmd = ["sh", "-c", 'trap "" INT; exec "$@"', "sh", *cmd]
        self.proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        self.lines: list[str] = []
        self._new: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        with self.proc.stdout:
            for line in self.proc.stdout:
                self.lines.append(line.rstrip("\n"))
                self._new.put(self.lines[-1])
        self._new.put(None)

    def wait_for(self, text: str, seconds: float) -> str:
        """The next line holding `text`; fails with the output so far after `seconds`, or when
        the command ends first."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._new.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                raise AssertionError(f"ended ({self.proc.wait()}) before {text!r}:\n{self.output}")
            if text in line:
                return line
        raise AssertionError(f"no {text!r} in {seconds:g} s:\n{self.output}")

    def wait(self, seconds: float) -> int:
        try:
            return self.proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running after {seconds:g} s:\n{self.output}") from None

    def interrupt(self, seconds: float = 60) -> int:
        """Ctrl-C, as a user stops it; killed if it has not ended after `seconds`."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    @property
    def output(self) -> str:
        return "\n".join(self.lines)


def clean(bed: Testbed, folder: Path) -> None:
    """After a test: every container and volume on the testbed's engines removed at once (killed:
    how a stack stops is for the tests of `down`, and a graceful stop of vLLM or Ray took up to
    20 s a test), then `down` of every config it wrote in `folder`, for what else it made."""
    bed.remove_containers()
    for config in folder.glob("*.yaml"):
        cli("down", config, cwd=folder)


def containers(node: Node, project: str) -> dict[str, Container]:
    docker = DockerClient(context=node.context)
    found = docker.container.list(
        all=True, filters=[("label", f"com.docker.compose.project={project}")]
    )
    return {(c.config.labels or {})["com.docker.compose.service"]: c for c in found}


def ids(nodes: list[Node], project: str) -> dict[str, dict[str, str]]:
    """node -> service -> its container's ID: the same IDs later mean nothing was made anew."""
    return {n.name: {s: c.id for s, c in containers(n, project).items()} for n in nodes}


def leftovers(node: Node, project: str) -> list[str]:
    """Containers, volumes and networks of the project still on the node."""
    docker = DockerClient(context=node.context)
    label = f"com.docker.compose.project={project}"
    containers = docker.container.list(all=True, filters=[("label", label)])
    volumes = docker.volume.list(filters=[("label", label)])
    networks = docker.network.list(filters=[("label", label)])
    return [
        *(f"container {c.name}" for c in containers),
        *(f"volume {v.name}" for v in volumes),
        *(f"network {n.name}" for n in networks),
    ]


def uncached(found: list[str]) -> list[str]:
    """`leftovers` less the compile caches' volumes, which outlive every removal but `down`."""
    return [item for item in found if "_compile-cache-" not in item]


def bundled(archive: Path, config: Path) -> dict[str, str]:
    """A diagnostics bundle's files by their path inside it; none holds a secret of `config`."""
    found = {}
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            if member.isfile():
                read = tar.extractfile(member)
                assert read is not None
                found[member.name.partition("/")[2]] = read.read().decode()
    for secret in state(config, ".").glob("*-*"):  # api-key, ray-token, front-door-*
        value = secret.read_text().strip()
        assert len(value) > 8 and all(value not in text for text in found.values()), secret
    return found


def on_terminal(args: list[str | Path], want: list[str], cwd: Path, limit: float = 90) -> str:
    """The screen of `vllm-compose ARGS` on a terminal (a tmux session of its own), once it shows
    every string in `want`; the session is ended either way."""
    session = f"vct-{os.getpid()}-{int(time.monotonic() * 1000)}"
    command = " ".join(shlex.quote(str(a)) for a in [sys.executable, "-m", "generator", *args])
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "200", "-y", "40", "-c",
                    str(cwd), command], check=True)  # fmt: skip
    screen, deadline = "", time.monotonic() + limit
    try:
        while time.monotonic() < deadline:
            shown = ["tmux", "capture-pane", "-p", "-t", session]
            screen = subprocess.run(shown, capture_output=True, text=True, check=False).stdout
            if all(w in screen for w in want):
                return screen
            time.sleep(1)
        raise AssertionError(f"not on the terminal after {limit:g} s: {want}\n{screen}")
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], check=False)


def promql(node: Node, query: str, want: int, seconds: float = 60) -> list[dict[str, Any]]:
    """The head's Prometheus (port 9090) asked `query` from `node` until it returns at least
    `want` series (bounded: once a second for `seconds`); the query and result are printed."""
    url = "http://192.168.200.12:9090/api/v1/query"
    found: list[dict[str, Any]] = []
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        out = node.nsexec("curl", "-s", "-m", "5", url, "--data-urlencode", f"query={query}",
                          check=False)  # fmt: skip
        if out.returncode == 0 and out.stdout:
            found = json.loads(out.stdout).get("data", {}).get("result", [])
            if len(found) >= want:
                break
        time.sleep(1)
    print(f"PromQL {query}:\n{json.dumps(found, indent=1)}")
    return found
