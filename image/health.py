#!/usr/bin/env python3
"""vllm-compose health checks, run inside the containers (standard library and Ray only).

ray --address HOST:PORT --expect IP[,IP...] [--gpus N]
    healthy when every expected IP is an alive Ray node and the cluster has at least N GPUs
serve --port P --model NAME [--prompt TEXT --expect REGEX [--max-tokens N]]
    healthy when a real completion (max_tokens 1) comes back: /health stays 200 with a dead engine;
    with a golden prompt, when its answer at temperature 0 contains a match of REGEX
nodes --address HOST:PORT
    prints the alive Ray nodes as JSON: {"IP": GPUs}
slots --address HOST:PORT
    prints every alive Ray node's GPU slots as JSON: {"IP": {"gpus": total, "free": free now}}
answers --port P --model NAME [--context N] [--tools] [--reasoning]
    prints the correctness gate's answers as JSON (answers.py): fixed greedy prompts twice, the
    context limit probed, the tool-call and reasoning parsers exercised
models --port P
    prints each served model's context length from /v1/models as JSON: {"NAME": max_model_len}
metrics --port P
    prints vLLM's load from its /metrics as JSON: {"running": n, "waiting": n, "tokens": total,
    "prompt_tokens": total, "kv_cache": fraction, "prefix_queries": total, "prefix_hits": total}
wait-for HOST:PORT --seconds S
    waits until a TCP connection to HOST:PORT succeeds
facts --interface IF --ip IP --listen PORT --peers IP[,IP...] [--api-port P] [--model PATH]
    prints what preflight compares across nodes, as JSON: the interface and its addresses,
    TCP reach to every peer's IP (listening on IP:PORT meanwhile, until every peer got through),
    versions, the model's files, /dev/shm, memlock, Ray's memory monitor setting, RDMA devices
gpus
    prints the GPUs (nvidia-smi's fields, `[N/A]` as null; throttle reasons by name) and the node's
    memory (/proc/meminfo) as JSON: {"devices": [...] or null, "gpu_error": ..., "memory": {...}}
drop-caches
    writes back dirty pages, drops the node's page cache (in a container with SYS_ADMIN and
    systempaths=unconfined only: the GPU of a unified-memory node takes from the same memory) and
    prints the memory before and after
manifest PATH
    prints the model's manifest as JSON: size and sha256 of every file (symlinks followed), and
    the revision when PATH is a Hugging Face cache snapshot
supervise -- COMMAND...
    runs COMMAND in step with its group across nodes (group.py; VLLM_COMPOSE_GROUP_* in the env)
send --root PATH --listen IP:PORT
    serves the files under PATH (symlinks followed) to `receive`, until stopped
receive --root PATH --source IP:PORT [--manifest FILE]   (default: the manifest on stdin)
    makes PATH hold exactly the manifest's files: a file whose size and sha256 already match is
    kept; any other is fetched into a .partial file, checked, then renamed. Prints progress as
    JSON lines; exits non-zero unless every file matches
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import urllib.error
import urllib.request
from collections.abc import Callable

# Its modules: in the wrapper image, in LIB (Dockerfile); in a checkout, beside this file.
LIB = "/usr/local/lib/vllm-compose"
sys.path.insert(1, LIB)

from answers import body_of, error_text, gate, headers  # noqa: E402
from canary import Canary  # noqa: E402
from facts import facts  # noqa: E402
from gpus import meminfo, report  # noqa: E402
from group import from_environment, run  # noqa: E402
from raychecks import check_ray, print_nodes, print_slots  # noqa: E402
from transfer import connect, manifest, receive, send  # noqa: E402

# Commands that print their result (JSON or a stream) instead of "<command> ok".
QUIET = (
    *("nodes", "slots", "metrics", "models", "answers", "facts", "gpus", "drop-caches"),
    *("manifest", "send", "receive", "supervise"),
)
DROP_CACHES = "/proc/sys/vm/drop_caches"


def check_serve(args: argparse.Namespace) -> str | None:
    golden = args.prompt is not None
    request = {"model": args.model, "prompt": args.prompt if golden else "ping", "max_tokens": 1}
    if golden:
        request.update(max_tokens=args.max_tokens, temperature=0)
    url = f"http://127.0.0.1:{args.port}/v1/completions"
    body = json.dumps(request).encode()
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, data=body, headers=headers()), timeout=args.timeout
        ) as response:
            choices = json.load(response).get("choices")
    except urllib.error.HTTPError as e:  # the server's own message, as a client would read it
        return f"completion at {url} failed: HTTP {e.code}: {error_text(body_of(e))}"
    except (OSError, urllib.error.URLError, ValueError) as e:
        return f"completion at {url} failed: {e}"
    if not choices:
        return f"completion at {url} returned no choices"
    text = str(choices[0].get("text", ""))
    if golden and not re.search(args.expect, text):
        return f"the golden prompt's answer {text[:200]!r} does not match {args.expect!r}"
    return None


def print_models(args: argparse.Namespace) -> str | None:
    url = f"http://127.0.0.1:{args.port}/v1/models"
    try:
        request = urllib.request.Request(url, headers=headers())
        with urllib.request.urlopen(request, timeout=10) as response:
            data = json.load(response).get("data") or []
    except (OSError, urllib.error.URLError, ValueError) as e:
        return f"{url} failed: {e}"
    print(json.dumps({m.get("id"): m.get("max_model_len") for m in data}, sort_keys=True))
    return None


def wait_for(args: argparse.Namespace) -> str | None:
    host, port = args.target.rsplit(":", 1)
    try:
        connect(host, port, args.seconds, timeout=2).close()
    except OSError as e:
        return f"{args.target} not reachable after {args.seconds:g} s: {e}"
    return None


# vLLM's Prometheus names (summed over their labels) -> our JSON keys.
LOAD = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:generation_tokens_total": "tokens",
    "vllm:prompt_tokens_total": "prompt_tokens",
    "vllm:kv_cache_usage_perc": "kv_cache",  # a fraction; the fullest engine's
    "vllm:prefix_cache_queries_total": "prefix_queries",  # prompt tokens looked up
    "vllm:prefix_cache_hits_total": "prefix_hits",  # of them, found in the cache
}


def load(port: int, timeout: float = 10) -> dict[str, float] | str:
    """What vLLM is doing now, from its /metrics (no API key: vLLM serves it without one); a
    string says why it could not be read."""
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            text = response.read().decode(errors="replace")
    except (OSError, urllib.error.URLError) as e:
        return f"{url} failed: {e}"
    found = dict.fromkeys(LOAD.values(), 0.0)
    for line in text.splitlines():
        name, _, rest = line.partition("{") if "{" in line else line.partition(" ")
        if name in LOAD:
            key, value = LOAD[name], float(rest.rsplit(" ", 1)[-1])
            found[key] = max(found[key], value) if key == "kv_cache" else found[key] + value
    return found


def print_load(args: argparse.Namespace) -> str | None:
    found = load(args.port)
    if isinstance(found, str):
        return found
    print(json.dumps(found, sort_keys=True))
    return None


def canary_check(port: int, model: str, timeout: float) -> Callable[[], str | None]:
    """The head serve's canary's completion (canary.py): None when answered, else why not."""
    args = argparse.Namespace(port=port, model=model, prompt=None, timeout=timeout)
    return lambda: check_serve(args)


def canary_tokens(port: int, timeout: float) -> Callable[[], float | None]:
    """The head serve's canary's count (canary.py): the tokens vLLM has counted (prompt and
    generated), None when /metrics could not be read. A queue full of real work delays the
    completion, not the count; a hung rank stops both."""

    def tokens() -> float | None:
        now = load(port, timeout)
        return now["tokens"] + now["prompt_tokens"] if isinstance(now, dict) else None

    return tokens


def drop_caches(_: argparse.Namespace) -> str | None:
    before = meminfo()
    os.sync()
    try:
        with open(DROP_CACHES, "w") as f:
            f.write("3\n")
    except OSError as e:
        return f"cannot drop the page cache: {e} (it needs SYS_ADMIN and systempaths=unconfined)"
    print(json.dumps({"before": before, "after": meminfo()}, sort_keys=True))
    return None


def parser() -> argparse.ArgumentParser:
    found = argparse.ArgumentParser(prog="vllm-compose-health")
    sub = found.add_subparsers(dest="check", required=True)
    ray = sub.add_parser("ray")
    ray.add_argument("--address", required=True)
    ray.add_argument("--expect", required=True)
    ray.add_argument("--gpus", type=float, default=0)
    serve = sub.add_parser("serve")
    serve.add_argument("--port", type=int, required=True)
    serve.add_argument("--model", required=True)
    serve.add_argument("--timeout", type=float, default=30)
    serve.add_argument("--prompt", help="a golden prompt, sent at temperature 0")
    serve.add_argument("--expect", default="", help="regex its answer must contain a match of")
    serve.add_argument("--max-tokens", type=int, default=16)
    for name in ("nodes", "slots"):
        sub.add_parser(name).add_argument("--address", required=True)
    for name in ("metrics", "models"):
        sub.add_parser(name).add_argument("--port", type=int, required=True)
    wait = sub.add_parser("wait-for")
    wait.add_argument("target")
    wait.add_argument("--seconds", type=float, default=300)
    _facts_arguments(sub.add_parser("facts"))
    answers = sub.add_parser("answers")
    answers.add_argument("--port", type=int, required=True)
    answers.add_argument("--model", required=True)
    answers.add_argument("--context", type=int, help="max_model_len, to probe the limit")
    answers.add_argument("--tools", action="store_true")
    answers.add_argument("--reasoning", action="store_true")
    sub.add_parser("gpus")
    sub.add_parser("drop-caches")
    sub.add_parser("manifest").add_argument("path")
    sender = sub.add_parser("send")
    sender.add_argument("--root", required=True)
    sender.add_argument("--listen", required=True)
    receiver = sub.add_parser("receive")
    receiver.add_argument("--root", required=True)
    receiver.add_argument("--source", required=True)
    receiver.add_argument("--manifest", help="the manifest's file (default: stdin)")
    sub.add_parser("supervise").add_argument("command", nargs=argparse.REMAINDER)
    return found


def _facts_arguments(facts_parser: argparse.ArgumentParser) -> None:
    facts_parser.add_argument("--interface", required=True)
    facts_parser.add_argument("--ip", required=True)
    facts_parser.add_argument("--listen", type=int, required=True)
    facts_parser.add_argument("--peers", default="")
    facts_parser.add_argument("--seconds", type=float, default=6)
    facts_parser.add_argument("--api-port", type=int)
    facts_parser.add_argument("--model")


def supervise(args: argparse.Namespace) -> str | None:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    member = from_environment()
    if not command or member is None:
        return "supervise needs a command, and VLLM_COMPOSE_GROUP_LISTEN or _ROOT in the env"
    canary = os.environ.get("VLLM_COMPOSE_CANARY")  # "SECONDS PORT MODEL", on the head's serve
    if canary:
        limit, port, model = canary.split(" ", 2)
        seconds, every = float(limit), min(float(limit) / 4, 5)
        check = canary_check(int(port), model, timeout=min(seconds, 30))
        member.canary = Canary(check, canary_tokens(int(port), every), seconds, every)
    sys.exit(run(member, command))


CHECKS: dict[str, Callable[[argparse.Namespace], str | None]] = {
    "ray": check_ray,
    "nodes": print_nodes,
    "slots": print_slots,
    "serve": check_serve,
    "metrics": print_load,
    "models": print_models,
    "answers": lambda a: print(json.dumps(gate(a.port, a.model, a.context, a.tools, a.reasoning))),
    "wait-for": wait_for,
    "facts": lambda args: facts(args),  # prints; never fails
    "gpus": lambda _: print(json.dumps(report(), sort_keys=True)),  # never fails
    "drop-caches": drop_caches,
    "manifest": manifest,
    "send": send,
    "receive": receive,
    "supervise": supervise,
}


def main() -> None:
    args = parser().parse_args()
    problem = CHECKS[args.check](args)
    if problem:
        print(f"vllm-compose-health: {problem}", file=sys.stderr)
        sys.exit(1)
    if args.check not in QUIET:
        print(f"vllm-compose-health: {args.check} ok")


if __name__ == "__main__":
    main()
