"""`make demo`: two emulated nodes (tests/testbed.py), a real Ray cluster across them, brought up
by `vllm-compose up` from a generated config, then one request to the endpoint.

The serve process in the demo image is the Ray STAND-IN (tests/standin_vllm.py) until the image
with real vLLM lands; everything up to it (engines, contexts, compose stacks, Ray, gates) is real.

    python -m tests.demo up | down
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from python_on_whales import DockerClient

from tests import images
from tests.testbed import IFNAME, MODELS, STATE, Testbed

CONFIG = Path("compose/demo.yaml")


def up() -> None:
    print("==> test images (built locally on first run; a few minutes)")
    image = images.standin_base(DockerClient())
    bed = Testbed.load() if (STATE / "testbed.json").exists() else Testbed.create(2)
    print("==> loading the image into each node's engine")
    bed.load_image(image)
    head, worker = bed.nodes[:2]
    CONFIG.parent.mkdir(exist_ok=True)
    CONFIG.write_text(
        f"name: demo\nimage: {image}\naccelerator: none\ninterface: {IFNAME}\nnodes:\n"
        f"  - {{name: {head.name}, ip: {head.ip}, context: {head.context}}}\n"
        f"  - {{name: {worker.name}, ip: {worker.ip}, context: {worker.context}}}\n"
        f"model: {{path: {MODELS}}}\nvllm: {{port: 30000}}\n"
    )
    print(f"==> vllm-compose up {CONFIG}")
    subprocess.run([sys.executable, "-m", "generator", "up", str(CONFIG)], check=True)
    url = f"http://{head.ip}:30000/v1/completions"
    request = [
        "curl",
        "-s",
        url,
        "-H",
        "Content-Type: application/json",
        "-d",
        '{"prompt": "Hello", "max_tokens": 8}',
    ]
    print(f"==> sample request from {worker.name}: {' '.join(request)}")
    print(worker.nsexec(*request).stdout)
    print(f"status: vllm-compose status {CONFIG}    stop: make demo-down")


def down() -> None:
    if CONFIG.exists():
        subprocess.run([sys.executable, "-m", "generator", "down", str(CONFIG)], check=False)
    if (STATE / "testbed.json").exists():
        Testbed.load().destroy()
    print("demo down")


if __name__ == "__main__":
    {"up": up, "down": down}[sys.argv[1] if len(sys.argv) > 1 else "up"]()
