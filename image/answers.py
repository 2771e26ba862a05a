"""The correctness gate's requests (standard library only), sent from inside the head's serve
container by `vllm-compose-health answers` (the key read from the secret file there):

- a fixed set of prompts answered greedily (temperature 0), twice, with the token IDs and their
  text (vLLM's `return_token_ids` and `logprobs`);
- the context limit: a prompt of `limit - 1` token IDs with one token to generate is answered,
  one of `limit` is refused with a clean 400;
- the parsers: one chat request with a tool offered (tool-call parser), one that asks for
  reasoning (reasoning parser), each answered with a well-formed message.

It prints what it saw as JSON; generator/operations/gate.py judges it.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any

API_KEY = "/run/secrets/api_key"
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "1, 2, 3, 4, 5,",
    "Water boils at a temperature of",
]
MAX_TOKENS = 16
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def headers() -> dict[str, str]:
    """JSON, and the serve container's key read from its secret file (never a command line)."""
    found = {"Content-Type": "application/json"}
    if os.path.exists(API_KEY):
        with open(API_KEY) as f:
            found["Authorization"] = f"Bearer {f.read().strip()}"
    return found


def post(port: int, path: str, body: dict[str, Any], timeout: float = 120) -> tuple[int, Any]:
    """HTTP status and JSON body (an error's body too; a string when it is not JSON)."""
    url = f"http://127.0.0.1:{port}{path}"
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers())
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as e:
        return e.code, body_of(e)
    except (OSError, ValueError) as e:
        return 0, f"{url} failed: {e}"


def body_of(e: urllib.error.HTTPError) -> Any:
    """An HTTP error's body: its JSON, else its text."""
    with e:
        text = e.read().decode(errors="replace")
    try:
        return json.loads(text)
    except ValueError:
        return text


def answer(port: int, model: str, prompt: str | list[int], max_tokens: int) -> dict[str, Any]:
    """One greedy completion: its token IDs, their text, the prompt's IDs, or the error."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "return_token_ids": True, "logprobs": 0}  # fmt: skip
    status, said = post(port, "/v1/completions", body)
    if status != 200:
        return {"status": status, "error": error_text(said)}
    choice = said["choices"][0]
    return {
        "status": status,
        "ids": choice.get("token_ids") or [],
        "tokens": (choice.get("logprobs") or {}).get("tokens") or [],
        "text": choice.get("text", ""),
        "prompt_ids": choice.get("prompt_token_ids") or said.get("prompt_token_ids") or [],
    }


def context(port: int, model: str, limit: int, seed: list[int]) -> dict[str, Any]:
    """A prompt that fills the context but for the one token to generate, then one token more."""
    ids = (seed or [1]) * (limit // max(1, len(seed)) + 2)
    at = answer(port, model, ids[: limit - 1], 1)
    over = answer(port, model, ids[:limit], 1)
    return {"limit": limit, "at_limit": at, "over_limit": over}


def chat(port: int, model: str, text: str, **more: Any) -> dict[str, Any]:
    body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 64,
            "temperature": 0, **more}  # fmt: skip
    status, said = post(port, "/v1/chat/completions", body)
    if status != 200:
        return {"status": status, "error": error_text(said)}
    message = said["choices"][0].get("message") or {}
    return {
        "status": status,
        "tool_calls": [c["function"] for c in message.get("tool_calls") or []],
        "reasoning": message.get("reasoning_content") or message.get("reasoning"),
        "content": message.get("content"),
    }


def gate(port: int, model: str, limit: int | None, tools: bool, reasoning: bool) -> dict[str, Any]:
    first = [answer(port, model, p, MAX_TOKENS) for p in PROMPTS]
    again = [answer(port, model, p, MAX_TOKENS) for p in PROMPTS]
    found: dict[str, Any] = {"prompts": PROMPTS, "answers": first, "again": again}
    if limit:
        found["context"] = context(port, model, limit, first[0].get("prompt_ids") or [])
    if tools:
        ask = "What is the weather in Paris? Use the get_weather tool."
        found["tools"] = chat(port, model, ask, tools=[TOOL], tool_choice="auto")
    if reasoning:
        found["reasoning"] = chat(port, model, "Think step by step: what is 17 + 25?")
    return found


def error_text(said: Any) -> str:
    if isinstance(said, dict):
        error = said.get("error")
        message = error.get("message") if isinstance(error, dict) else error or said
        return str(message)[:300]
    return str(said)[:300]
