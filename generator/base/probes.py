"""Every command line of the wrapper's health tool (image/health.py, `vllm-compose-health` in the
image), built in one place: the stacks' healthchecks, up's readiness probes, preflight's facts,
the lock's manifest and the model sync."""

from __future__ import annotations

HEALTH = "vllm-compose-health"
# The supervisor's lines in a service's log (image/group.py): its command started; its command
# exited by itself and waits for its back-off (the container still runs).
SAID = "vllm-compose: "
STARTING = "starting"
EXITED = "exited with code"


def supervisor_said(line: str) -> str | None:
    """What the supervisor said in a log line, if it did: anywhere in the line, since a command
    may end without a newline and the supervisor's line then follows on the same one."""
    _, found, said = line.rpartition(SAID)
    return said if found else None


def exited(log: str) -> bool:
    """Does the supervisor's last line in `log` say its command exited by itself?"""
    said = [s for line in log.splitlines() if (s := supervisor_said(line)) is not None]
    return bool(said) and EXITED in said[-1]


def ray(gcs: str, expect: list[str], gpus: int | None = None) -> list[str]:
    """Healthy when every expected IP is alive in Ray (and the cluster has `gpus`)."""
    cmd = [HEALTH, "ray", "--address", gcs, "--expect", ",".join(expect)]
    return [*cmd, "--gpus", str(gpus)] if gpus is not None else cmd


def serve(port: int, model: str, timeout: float | None = None) -> list[str]:
    """Healthy when a real completion (max_tokens 1) comes back."""
    cmd = [HEALTH, "serve", "--port", str(port), "--model", model]
    return [*cmd, "--timeout", f"{timeout:g}"] if timeout is not None else cmd


def golden(port: int, model: str, prompt: str, expect: str, max_tokens: int) -> list[str]:
    """Healthy when the golden prompt's answer (temperature 0) contains a match of `expect`."""
    cmd = [HEALTH, "serve", "--port", str(port), "--model", model, "--prompt", prompt]
    return [*cmd, "--expect", expect, "--max-tokens", str(max_tokens), "--timeout", "120"]


def metrics(port: int) -> list[str]:
    """vLLM's load as JSON: requests running and waiting, generated tokens so far."""
    return [HEALTH, "metrics", "--port", str(port)]


def models(port: int) -> list[str]:
    """Each served model's context length, from vLLM's /v1/models (the key read inside)."""
    return [HEALTH, "models", "--port", str(port)]


def answers(port: int, model: str, context: int | None, tools: bool, reasoning: bool) -> list[str]:
    """The correctness gate's answers as JSON (image/answers.py)."""
    cmd = [HEALTH, "answers", "--port", str(port), "--model", model]
    cmd += ["--context", str(context)] if context else []
    return cmd + ["--tools"] * tools + ["--reasoning"] * reasoning


def nodes(gcs: str) -> list[str]:
    return [HEALTH, "nodes", "--address", gcs]


def slots(gcs: str) -> list[str]:
    return [HEALTH, "slots", "--address", gcs]


def facts(
    interface: str,
    ip: str,
    listen: int,
    peers: list[str] | None = None,
    seconds: float | None = None,
    model: str | None = None,
    api_port: int | None = None,
) -> list[str]:
    """What preflight compares across nodes (the JSON `Facts`)."""
    cmd = ["facts", "--interface", interface, "--ip", ip, "--listen", str(listen)]
    if peers is not None:
        cmd += ["--peers", ",".join(peers)]
    if seconds is not None:
        cmd += ["--seconds", f"{seconds:g}"]
    if model is not None:
        cmd += ["--model", model]
    if api_port is not None:
        cmd += ["--api-port", str(api_port)]
    return [HEALTH, *cmd]


def manifest(path: str) -> list[str]:
    return [HEALTH, "manifest", path]


def send(root: str, listen: str) -> list[str]:
    return [HEALTH, "send", "--root", root, "--listen", listen]


def receive(root: str, source: str, manifest_file: str) -> list[str]:
    return [HEALTH, "receive", "--root", root, "--source", source, "--manifest", manifest_file]


def gpus() -> list[str]:
    """The GPUs (temperature, power, clock reasons, memory) and the node's memory, as JSON."""
    return [HEALTH, "gpus"]


def drop_caches() -> list[str]:
    """The node's page cache dropped (SYS_ADMIN, /proc/sys writable); memory before and after."""
    return [HEALTH, "drop-caches"]
