#!/usr/bin/python3
"""STAND-IN for `vllm serve`, used only in the Ray-backend deploy tests' image, which need no model
(test_e2e.py runs the real vLLM). It does what the deploy path depends on and nothing more:
attaches to the head's Ray session as a driver, waits for a placement group of the GPU slots
TP x PP asks for, and answers the OpenAI completion route. It never pretends to generate: the
text is fixed and says so.
"""

import argparse
import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def wait_for_placement(needed: int) -> None:
    """As vLLM's Ray executor: one GPU slot per rank in a placement group, waited for up to
    1800 s, with vLLM's log line after 10 s, 20 s more, 40 s more... (what `up` watches for)."""
    import ray
    from ray.util.placement_group import placement_group

    group = placement_group([{"GPU": 1.0}] * needed)
    start, interval = time.time(), 10
    while time.time() - start < 1800:
        ready, _ = ray.wait([group.ready()], timeout=interval)
        if ready:
            return
        interval *= 2
        print(
            "INFO stand-in vllm: Waiting for creating a placement group of specs for "
            f"{int(time.time() - start)} seconds. specs={group.bundle_specs}",
            flush=True,
        )
    sys.exit(f"stand-in vllm: no placement group of {needed} GPU slots after 1800 s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("command")
    parser.add_argument("model")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--pipeline-parallel-size", type=int, default=1)
    parser.add_argument("--served-model-name")
    args, _ = parser.parse_known_args()

    import ray

    ray.init(address="auto")  # the head's session, through the shared /tmp/ray
    needed = args.tensor_parallel_size * args.pipeline_parallel_size
    wait_for_placement(needed)
    nodes = sorted(n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"])
    print(f"stand-in vllm: attached to Ray, nodes {nodes}, serving on :{args.port}", flush=True)
    name = args.served_model_name or args.model
    key = os.environ.get("VLLM_API_KEY")  # as vLLM: when set, every /v1 request must carry it

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self._send({"object": "list", "data": [{"id": name}]} if "models" in self.path else {})

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if key and self.headers.get("Authorization") != f"Bearer {key}":
                self._send({"error": "Unauthorized"}, 401)
                return
            self._send(
                {"model": name, "choices": [{"index": 0, "text": "stand-in"}], "ray_nodes": nodes}
            )

        def _send(self, body: dict[str, object], status: int = 200) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer((args.host, args.port), Handler)
    print("INFO:     Application startup complete.", flush=True)  # uvicorn's line, as vLLM's
    server.serve_forever()


if __name__ == "__main__":
    main()
