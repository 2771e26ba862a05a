"""Which proxy is the front door: HAProxy against LiteLLM's proxy, side by side in one run, each in
front of the same real vLLM (CPU, the tiny model) on this machine's loopback.

    python -m benchmarks.proxies

Both are set up for the front door's goals as their own documentation says: HAProxy (Debian's
package) holds a request with L7 retries (`retry-on`, one second apart), checks the client's
key against a map of SHA-256 hashes, and sends each streamed chunk on at once (`option
http-no-delay`: without it, HAProxy's wait for full packets added about 180 ms to the first
token, measured here); LiteLLM's proxy (PyPI, `litellm[proxy]`) retries through its router
(`num_retries`, `retry_after`, cooldowns off) and checks its master key.

Two measures, on each of the three endpoints (vLLM direct, through HAProxy, through LiteLLM):
- cost: vLLM's own `vllm bench serve` at `bench`'s defaults (concurrency 1, 4 and 16, 32 prompts
  each, chat completions of random prompts, cut to the tiny model's context as `bench` cuts
  them), the three endpoints in turn, two rounds: each run's output tokens/s and median TTFT,
  then the median over the rounds against direct's;
- a restart: 4 clients send non-streamed chat completions (each may wait 150 s) while vLLM's
  container is killed and started again: failed requests, and the longest a request was held.

What it starts, it ends: the vLLM container, haproxy and litellm, by their IDs.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from python_on_whales import DockerClient

from benchmarks.report import Figure, record
from generator.stack import doorfiles
from tests.support import images
from tests.support.load import Load

VLLM_PORT, HAPROXY_PORT, LITELLM_PORT = 38100, 38101, 38102
NAME = "tiny"  # the served model name
CONTAINER = "vllm-compose-proxies-vllm"
LITELLM = images.CACHE / "litellm-venv"
CONCURRENCIES = (1, 4, 16)  # bench's defaults
PROMPTS = 32
INPUT_LEN, OUTPUT_LEN = 128, 64  # bench's 256/128 cut to a context of 256, as bench cuts them
HOLD = 150  # seconds a client waits, and the proxies hold, a request

HAPROXY_CFG = """\
global
    tune.bufsize 262144
defaults
    mode http
    option http-no-delay
    timeout connect 1s
    timeout client 600s
    timeout server 600s
    retries {retries}
    retry-on conn-failure empty-response response-timeout 500 502 503 504
frontend api
    bind 127.0.0.1:{port}
    acl known req.hdr(authorization),word(2,' '),sha2(256),hex,lower,map({keys}) -m found
    http-request deny deny_status 401 unless known
    default_backend vllm
backend vllm
    server vllm 127.0.0.1:{upstream}
"""

LITELLM_CFG = """\
model_list:
  - model_name: {name}
    litellm_params:
      model: hosted_vllm/{name}
      api_base: http://127.0.0.1:{upstream}/v1
      api_key: none
router_settings:
  num_retries: {retries}
  retry_after: 1
  disable_cooldowns: true
  timeout: 600
litellm_settings:
  request_timeout: 600
general_settings:
  master_key: {key}
"""


def say(line: str) -> None:
    print(line, flush=True)


def litellm() -> Path:
    """LiteLLM's proxy in its own virtual environment, made once."""
    binary = LITELLM / "bin" / "litellm"
    if not binary.exists():
        say("proxies: installing litellm[proxy] into a virtual environment (a minute or two)")
        subprocess.run([sys.executable, "-m", "venv", str(LITELLM)], check=True)
        pip = [str(LITELLM / "bin" / "pip"), "install", "-q", "litellm[proxy]"]
        subprocess.run(pip, check=True)
    return binary


def haproxy() -> str:
    found = shutil.which("haproxy")
    if found is None:
        say("proxies: installing Debian's haproxy")
        subprocess.run(["apt-get", "install", "-y", "-q", "haproxy"], check=True)
        found = shutil.which("haproxy") or "/usr/sbin/haproxy"
    return found


def answers(port: int, key: str, limit: float) -> float:
    """Seconds until a chat completion comes back through `port`."""
    start = time.monotonic()
    body = {"model": NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    while time.monotonic() - start < limit:
        request = urllib.request.Request(url, json.dumps(body).encode(), headers)
        with contextlib.suppress(OSError, ValueError), urllib.request.urlopen(request, timeout=5):
            return time.monotonic() - start
        time.sleep(0.5)
    raise SystemExit(f"proxies: nothing answered on port {port} within {limit:.0f} s")


@contextlib.contextmanager
def vllm(docker: DockerClient, model: Path) -> Iterator[None]:
    if docker.container.exists(CONTAINER):  # left by a run that was killed
        docker.container.remove(CONTAINER, force=True)
    serve = ["vllm", "serve", "/model", "--served-model-name", NAME, "--host", "127.0.0.1",
             "--port", str(VLLM_PORT), "--max-model-len", "256", "--dtype", "float32",
             "--enforce-eager"]  # fmt: skip
    docker.run(images.vllm_base(docker), serve, name=CONTAINER, detach=True, networks=["host"],
               shm_size="1g",
               volumes=[(model, "/model", "ro")])  # fmt: skip
    try:
        yield
    finally:
        docker.container.remove(CONTAINER, force=True)


@contextlib.contextmanager
def started(command: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield process
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def bench(
    docker: DockerClient, model: Path, port: int, key: str, concurrency: int
) -> dict[str, Any]:
    """vLLM's benchmark client, in the vLLM image on the host's network, against `port`."""
    command = [
        "vllm", "bench", "serve", "--backend", "openai-chat",
        "--base-url", f"http://127.0.0.1:{port}", "--endpoint", "/v1/chat/completions",
        "--model", NAME, "--tokenizer", "/model", "--dataset-name", "random",
        "--random-input-len", str(INPUT_LEN), "--random-output-len", str(OUTPUT_LEN),
        "--num-prompts", str(PROMPTS), "--max-concurrency", str(concurrency),
        "--disable-tqdm", "--save-result", "--result-dir", "/out", "--result-filename", "r.json",
    ]  # fmt: skip
    with tempfile.TemporaryDirectory() as out:
        Path(out).chmod(0o777)  # the image's user writes the result
        docker.run(images.vllm_base(docker), command, remove=True, networks=["host"],
                   envs={"OPENAI_API_KEY": key},
                   volumes=[(model, "/model", "ro"), (out, "/out")])  # fmt: skip
        result: dict[str, Any] = json.loads((Path(out) / "r.json").read_text())
    return result


def cost(docker: DockerClient, model: Path, ports: dict[str, int], key: str) -> list[Figure]:
    """Each endpoint in turn, each concurrency, twice; ratios against direct in the same round."""
    rows: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for round_ in (1, 2):
        for concurrency in CONCURRENCIES:
            for name, port in ports.items():
                found = bench(docker, model, port, key, concurrency)
                rows.setdefault((name, concurrency), []).append(found)
                say(f"cost: round {round_}, concurrency {concurrency}, {name}: "
                    f"{found['output_throughput']:.1f} tok/s, TTFT p50 "
                    f"{found['median_ttft_ms']:.2f} ms, failed {found['failed']}")  # fmt: skip
    say("\ncost, median of the two rounds (ratio and TTFT against direct):")
    figures = []
    for concurrency in CONCURRENCIES:
        direct = rows[("direct", concurrency)]
        tps = statistics.median(r["output_throughput"] for r in direct)
        ttft = statistics.median(r["median_ttft_ms"] for r in direct)
        for name in ports:
            runs = rows[(name, concurrency)]
            mine = statistics.median(r["output_throughput"] for r in runs)
            first = statistics.median(r["median_ttft_ms"] for r in runs)
            say(f"  concurrency {concurrency:2} {name:8} {mine:8.1f} tok/s ({mine / tps:.3f}x)"
                f"  TTFT p50 {first:7.2f} ms ({first - ttft:+.2f} ms)")  # fmt: skip
            if name != "direct":
                said = f"{mine / tps:.3f}x direct's tok/s, TTFT p50 {first - ttft:+.1f} ms"
                figures.append(Figure(f"{name} at concurrency {concurrency}", said))
    return figures


def restart(docker: DockerClient, port: int, key: str, name: str) -> Figure:
    """4 clients through `port`, half of their requests streamed, while vLLM is killed and
    started again: what each kind of request saw."""
    load = Load(f"http://127.0.0.1:{port}/v1/chat/completions", key, NAME, timeout=HOLD,
                max_tokens=64)  # fmt: skip
    with load.running(4):
        time.sleep(5)
        docker.container.kill(CONTAINER)
        docker.container.wait(CONTAINER)
        docker.container.start(CONTAINER)
        back = answers(VLLM_PORT, key, 600)
        time.sleep(5)
    say(f"restart through {name}: vLLM answered again {back:.0f} s after the kill")
    for streamed in (False, True):
        done = [r for r in load.done if r.streamed == streamed]
        failed = [r for r in done if not r.ok]
        held = max((r.end - r.start for r in done if r.ok), default=0.0)
        kinds = Counter(r.error.split(":")[0][:60] for r in failed)
        what = "streamed" if streamed else "non-streamed"
        say(
            f"  {what}: {len(done)} requests, {len(failed)} failed {dict(kinds) or ''}, "
            f"longest answered {held:.1f} s"
        )
    plain = [r for r in load.done if not r.streamed]
    lost = sum(not r.ok for r in plain)
    proxied = name != "direct"  # a proxy's goal: every non-streamed request held
    return Figure(f"plain requests failed through a restart, {name}", f"{lost} of {len(plain)}",
                  "0" if proxied else "", lost == 0 if proxied else None)  # fmt: skip


def resident(pid: int) -> int:
    """The process's resident memory and its children's, in MiB."""
    total = 0
    for task in [pid, *map(int, Path(f"/proc/{pid}/task/{pid}/children").read_text().split())]:
        for line in Path(f"/proc/{task}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    return total // 1024


def main() -> None:
    docker = DockerClient()
    model = images.tiny_model(docker)
    binary, proxy = litellm(), haproxy()
    key = "sk-" + secrets.token_hex(16)
    with tempfile.TemporaryDirectory() as work, vllm(docker, model):
        folder = Path(work)
        admin = {doorfiles.ADMIN: doorfiles.hashed(key)}
        (folder / "keys.map").write_text(doorfiles.keys_map(admin))
        (folder / "haproxy.cfg").write_text(
            HAPROXY_CFG.format(
                retries=HOLD, port=HAPROXY_PORT, keys=folder / "keys.map", upstream=VLLM_PORT
            )
        )
        (folder / "litellm.yaml").write_text(LITELLM_CFG.format(
            name=NAME, upstream=VLLM_PORT, retries=HOLD, key=key))  # fmt: skip
        ha = [proxy, "-db", "-f", str(folder / "haproxy.cfg")]
        ll = [str(binary), "--config", str(folder / "litellm.yaml"), "--host", "127.0.0.1",
              "--port", str(LITELLM_PORT)]  # fmt: skip
        with started(ha, folder / "haproxy.log") as hp, started(ll, folder / "litellm.log") as lp:
            say(f"vLLM answers after {answers(VLLM_PORT, key, 900):.0f} s")
            answers(HAPROXY_PORT, key, 60)
            answers(LITELLM_PORT, key, 120)
            ports = {"direct": VLLM_PORT, "haproxy": HAPROXY_PORT, "litellm": LITELLM_PORT}
            figures = cost(docker, model, ports, key)
            memory = f"HAProxy {resident(hp.pid)} MiB, LiteLLM {resident(lp.pid)} MiB"
            say(f"resident memory after the cost runs: {memory}")
            figures.append(Figure("resident memory after the cost runs", memory))
            figures += [restart(docker, port, key, name) for name, port in ports.items()]
    about = ("One real vLLM (CPU build, the tiny Llama) on loopback; in front of it Debian's"
             " HAProxy and LiteLLM's proxy, each set to hold requests for 150 s and check a key."
             " Cost: `vllm bench serve` at each concurrency, two rounds, against direct; restart:"
             " 4 clients while vLLM's container is killed and started again.")  # fmt: skip
    goal = "hold every non-streamed request through a restart; cost within the noise of direct"
    record("The front door's proxy: HAProxy against LiteLLM", about, goal, figures)


if __name__ == "__main__":
    main()
