"""check's judging alone, over answers shaped as image/answers.py prints them (the real gate
against the served tiny model, and an upgrade that changes its answers, are in test_upgrade.py);
and the gate's requests against a stand-in HTTP API: what they send, and how errors come back."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import answers
import pytest

from generator.operations import gate


def said(ids: list[int], tokens: list[str] | None = None) -> dict[str, Any]:
    return {"status": 200, "ids": ids, "tokens": tokens or [f"t{i}" for i in ids]}


def found(
    first: list[list[int]], again: list[list[int]] | None = None, **more: Any
) -> dict[str, Any]:
    prompts = [f"p{i}" for i in range(len(first))]
    return {"prompts": prompts, "answers": [said(a) for a in first],
            "again": [said(a) for a in again or first]} | more  # fmt: skip


def lines(verdicts: list[gate.Verdict]) -> list[str]:
    return [v.line() for v in verdicts]


def test_a_healthy_first_check_passes_and_says_what_it_records() -> None:
    context = {"limit": 256, "at_limit": {"status": 200}, "over_limit": {"status": 400}}
    verdicts = gate.judge(found([[1, 2], [3, 4]], context=context), None)
    assert lines(verdicts) == [
        "check: determinism: ok: 2 greedy prompts asked twice gave the same tokens",
        "check: golden: skipped: no answers recorded yet: these are recorded now",
        "check: context: ok: 256 tokens answered, 257 refused cleanly (400)",
    ]
    assert gate.report(verdicts)["ok"] is True


def test_a_change_is_named_with_the_prompt_and_the_first_token_that_differs() -> None:
    recorded = found([[1, 2, 3], [4, 5, 6]])
    now = found([[1, 2, 3], [4, 9, 6]])
    now["answers"][1]["tokens"] = ["a", " Paris", "b"]
    recorded["answers"][1]["tokens"] = ["a", " Lyon", "b"]
    verdict = gate.golden(now, recorded)
    assert verdict.ok is False
    assert verdict.said == (
        "prompt 2 of 2 against the recorded: token 2 differs: ' Lyon' (id 5) then ' Paris' (id 9)"
    )
    shorter = gate.golden(found([[1, 2, 3], [4, 5]]), recorded)
    assert shorter.said.endswith("prompt 2 of 2 against the recorded: 3 tokens, then 2")
    assert gate.golden(found([[1, 2, 3], [4, 5, 6]]), recorded).ok is True


def test_answers_that_do_not_repeat_fail_determinism_and_a_failed_request_fails_its_gate() -> None:
    verdicts = gate.judge(found([[1, 2]], again=[[1, 3]]), None)
    assert verdicts[0].ok is False and "token 2 differs: 't2' (id 2) then 't3' (id 3)" in (
        verdicts[0].said
    )
    broken = found([[1]])
    broken["again"][0] = {"status": 500, "error": "EngineDeadError"}
    assert gate.judge(broken, None)[0].said == "a request failed: EngineDeadError"
    assert gate.report(gate.judge(broken, None))["ok"] is False


def test_the_context_limit_must_be_answered_and_one_more_token_refused() -> None:
    def verdict(at: int, over: int) -> gate.Verdict:
        probe = {"limit": 64, "at_limit": {"status": at, "error": "too long"},
                 "over_limit": {"status": over, "error": "boom"}}  # fmt: skip
        return gate.judge(found([[1]], context=probe), None)[2]

    assert verdict(400, 400).said == "a prompt of 63 tokens + 1 failed: too long"
    assert verdict(200, 200).said == "a prompt of 64 tokens + 1 was answered"
    assert verdict(200, 500).said == "a prompt of 64 tokens + 1 was failed: boom"
    assert gate.judge(found([[1]]), None)[2].ok is None  # no max_model_len known


def test_the_parsers_are_judged_only_when_the_args_name_them() -> None:
    tools = {"status": 200, "tool_calls": [{"name": "get_weather", "arguments": "{}"}]}
    reasoning = {"status": 400, "error": "no chat template"}
    verdicts = gate.judge(found([[1]], tools=tools, reasoning=reasoning), None)
    assert lines(verdicts)[3:] == [
        "check: tool-call parser: ok: 1 tool call(s) parsed",
        "check: reasoning parser: FAILED: failed: no chat template",
    ]


def test_recorded_answers_live_beside_the_config_with_the_lock(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    assert gate.recorded(config) is None
    path = gate.record(config, found([[1, 2]]), None)
    assert path == tmp_path / "c.answers.json"
    kept = gate.recorded(config)
    assert kept is not None and kept["lock"] == "unlocked" and kept["answers"][0]["ids"] == [1, 2]


class Api(BaseHTTPRequestHandler):
    """Answers completions as vLLM does (token IDs, their text), and refuses a prompt longer
    than 8 tokens with vLLM's error body."""

    seen: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append(body)
        prompt = body.get("prompt")
        if body.get("model") == "elsewhere":
            self._send(404, {"error": {"message": "The model `elsewhere` does not exist."}})
            return
        if isinstance(prompt, list) and len(prompt) + body["max_tokens"] > 8:
            error = {"error": {"message": "This model's maximum context length is 8 tokens."}}
            self._send(400, error)
            return
        choice = {"text": " a b", "token_ids": [5, 6], "prompt_token_ids": [1, 2, 3],
                  "logprobs": {"tokens": [" a", " b"]}}  # fmt: skip
        self._send(200, {"choices": [choice]})

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def api() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Api)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_the_gates_requests_greedy_with_token_ids_and_the_context_probed_by_ids(api: int) -> None:
    Api.seen.clear()
    result = answers.gate(api, "tiny", 8, tools=False, reasoning=False)
    first = Api.seen[0]
    assert first["temperature"] == 0 and first["return_token_ids"] is True
    assert result["answers"][0] | {"status": 200} == {
        "status": 200, "ids": [5, 6], "tokens": [" a", " b"], "text": " a b",
        "prompt_ids": [1, 2, 3],
    }  # fmt: skip
    probe = result["context"]
    assert [len(b["prompt"]) for b in Api.seen[-2:]] == [7, 8]
    assert probe["at_limit"]["status"] == 200
    assert probe["over_limit"] == {
        "status": 400, "error": "This model's maximum context length is 8 tokens."
    }  # fmt: skip
    verdicts = gate.judge(result, None)
    assert [v.ok for v in verdicts] == [True, None, True]


def test_the_health_tools_completion_check_names_the_servers_own_message(api: int) -> None:
    """What `bench` reports when its requests failed: the server's message, not only the HTTP
    reason vLLM's benchmark client keeps."""
    health = [sys.executable, "image/health.py", "serve", "--port", str(api)]
    refused = subprocess.run([*health, "--model", "elsewhere"], capture_output=True, text=True)
    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        f"vllm-compose-health: completion at http://127.0.0.1:{api}/v1/completions failed:"
        " HTTP 404: The model `elsewhere` does not exist."
    )
    answered = subprocess.run([*health, "--model", "tiny"], capture_output=True, text=True)
    assert answered.returncode == 0, answered.stderr
