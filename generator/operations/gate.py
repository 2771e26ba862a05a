"""`check`: the correctness gate. Its requests run inside the head's serve container
(image/answers.py); here they are judged, one verdict per gate:

- determinism: the fixed greedy prompts, asked twice, give the same tokens;
- golden: their tokens match the answers recorded beside the config (CONFIG-STEM.answers.json,
  written by the first check, by `check --record`, and by an upgrade whose changed answers were
  accepted); a change is named with the prompt and the first token that differs;
- context: a prompt that fills `max_model_len` but for the token to generate is answered, and
  one token more is refused cleanly (a 400 with vLLM's message);
- parsers: with a tool-call or reasoning parser in the args, one request that exercises it is
  answered with a well-formed message.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from python_on_whales import DockerException

from generator.base import probes, sidefiles
from generator.base.errors import BadFile, PhaseError, reason
from generator.config import ports
from generator.nodes import served
from generator.nodes.fleet import Fleet
from generator.operations import lock
from generator.stack.output import write_atomic


@dataclass(frozen=True)
class Verdict:
    gate: str
    ok: bool | None  # None: not run (nothing to check it against)
    said: str

    def line(self) -> str:
        mark = {True: "ok", False: "FAILED", None: "skipped"}[self.ok]
        return f"check: {self.gate}: {mark}: {self.said}"


def ask(fleet: Fleet) -> dict[str, Any]:
    """The gate's answers from the served model, asked inside the head's serve."""
    c = fleet.cluster
    args = " ".join(c.vllm.args)
    probe = probes.answers(ports.vllm(c), c.served_model_name, served.context(fleet, "check"),
                           tools="--tool-call-parser" in args,
                           reasoning="--reasoning-parser" in args)  # fmt: skip
    try:
        found: dict[str, Any] = json.loads(fleet.execute(fleet.head, "serve", probe))
    except DockerException as e:
        raise PhaseError(fleet.head.name, "check", reason(e)) from None
    return found


def judge(found: dict[str, Any], recorded: dict[str, Any] | None) -> list[Verdict]:
    return [
        _same("determinism", found["answers"], found["again"], "asked twice"),
        golden(found, recorded),
        _context(found.get("context")),
        *_parsers(found),
    ]


def _same(gate: str, before: list[dict[str, Any]], now: list[dict[str, Any]], how: str) -> Verdict:
    n = len(now)
    failed = [a.get("error") for a in [*before, *now] if a.get("status") != 200]
    if failed:
        return Verdict(gate, False, f"a request failed: {failed[0]}")
    for i, (a, b) in enumerate(zip(before, now, strict=True)):
        if a["ids"] != b["ids"]:
            return Verdict(gate, False, f"prompt {i + 1} of {n} {how}: {_first_difference(a, b)}")
    return Verdict(gate, True, f"{n} greedy prompts {how} gave the same tokens")


def _first_difference(a: dict[str, Any], b: dict[str, Any]) -> str:
    at = next((i for i, (x, y) in enumerate(zip(a["ids"], b["ids"], strict=False)) if x != y), None)
    if at is None:
        return f"{len(a['ids'])} tokens, then {len(b['ids'])}"
    return f"token {at + 1} differs: {_token(a, at)} then {_token(b, at)}"


def _token(answer: dict[str, Any], at: int) -> str:
    text = answer["tokens"][at] if at < len(answer.get("tokens") or []) else "?"
    return f"{text!r} (id {answer['ids'][at]})"


def golden(found: dict[str, Any], recorded: dict[str, Any] | None) -> Verdict:
    if recorded is None:
        return Verdict("golden", None, "no answers recorded yet: these are recorded now")
    if recorded["prompts"] != found["prompts"]:
        return Verdict("golden", None, "the recorded answers are for other prompts: record again")
    verdict = _same("golden", recorded["answers"], found["answers"], "against the recorded")
    if verdict.ok:
        return Verdict("golden", True, f"the {len(found['answers'])} recorded answers, unchanged")
    return verdict


def _context(probe: dict[str, Any] | None) -> Verdict:
    if probe is None:
        return Verdict("context", None, "the model's context length is not known")
    limit, at, over = probe["limit"], probe["at_limit"], probe["over_limit"]
    if at.get("status") != 200:
        said = f"a prompt of {limit - 1} tokens + 1 failed: {at['error']}"
        return Verdict("context", False, said)
    if over.get("status") != 400:
        got = "answered" if over.get("status") == 200 else f"failed: {over.get('error')}"
        return Verdict("context", False, f"a prompt of {limit} tokens + 1 was {got}")
    return Verdict("context", True, f"{limit} tokens answered, {limit + 1} refused cleanly (400)")


def _parsers(found: dict[str, Any]) -> list[Verdict]:
    verdicts = []
    for gate, what in (("tools", "tool-call"), ("reasoning", "reasoning")):
        said = found.get(gate)
        if said is None:
            continue
        if said.get("status") != 200:
            verdicts.append(Verdict(f"{what} parser", False, f"failed: {said.get('error')}"))
            continue
        calls = said.get("tool_calls") or []
        parsed = f"{len(calls)} tool call(s) parsed"
        if gate == "reasoning":
            parsed = "reasoning parsed apart" if said.get("reasoning") else "no reasoning given"
        verdicts.append(Verdict(f"{what} parser", True, parsed))
    return verdicts


def path_for(config: Path) -> Path:
    return sidefiles.Beside(config).answers


def recorded(config: Path) -> dict[str, Any] | None:
    """The golden answers `check` recorded; None when there are none. Read (and refused: a link,
    over 1 MiB, not JSON, not of their shape; exit 2) before any engine is asked."""
    path = path_for(config)
    if not path.exists() and not path.is_symlink():
        return None
    found = sidefiles.read_json(path, what="golden answers")
    if not _shaped(found):
        raise BadFile(
            f'{path}: not golden answers ({{"prompts": [text], "answers": [{{"status",'
            ' "ids", "tokens"}]}, one answer per prompt)',
            f"move it away; `vllm-compose check {config}` records them again",
        )
    return dict(found)


def _shaped(found: Any) -> bool:
    if not isinstance(found, dict):
        return False
    prompts, answers = found.get("prompts"), found.get("answers")
    if not isinstance(prompts, list) or not isinstance(answers, list):
        return False
    if len(prompts) != len(answers) or not all(isinstance(p, str) for p in prompts):
        return False
    return all(_answer(a) for a in answers)


def _answer(a: Any) -> bool:
    if not isinstance(a, dict) or not isinstance(a.get("status"), int):
        return False
    if a["status"] != 200:
        return True
    ids, tokens = a.get("ids"), a.get("tokens")
    return (isinstance(ids, list) and all(isinstance(i, int) for i in ids)
            and isinstance(tokens, list) and all(isinstance(t, str) for t in tokens))  # fmt: skip


def record(config: Path, found: dict[str, Any], locked: lock.Lock | None) -> Path:
    """The answers as the golden ones, with the lock they came from."""
    kept = {"lock": lock.key(locked), "prompts": found["prompts"],
            "answers": found["answers"]}  # fmt: skip
    path = path_for(config)
    write_atomic(path, json.dumps(kept, indent=1) + "\n")
    return path


def report(verdicts: list[Verdict]) -> dict[str, Any]:
    return {"ok": all(v.ok is not False for v in verdicts), "gates": [asdict(v) for v in verdicts]}
