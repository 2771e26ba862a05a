"""`up`'s question to the front door right after starting it (nodes/door.answers): when it asks
again, and what it says when the door does not answer. A FAKE fleet stands for the node: this is
our logic alone (tests/test_deploy.py runs it against a real door that cannot bind its port)."""

from __future__ import annotations

import types
from typing import Any, cast

import pytest

from generator.base.errors import DockerError, PhaseError
from generator.nodes import door
from generator.nodes.fleet import Fleet

MODEL = "/models/Qwen3.5-122B-A10B-FP8"
REFUSED = DockerError("spark-1", "models failed: <urlopen error [Errno 111] Connection refused>")
OLD_KEYS = DockerError("spark-1", "models failed: HTTP Error 401: Unauthorized")


class FakeFleet:
    """What `answers` uses of a Fleet: one_off gives each of `answers` in turn (raising errors)."""

    def __init__(self, *answers: object) -> None:
        self.answers = list(answers)
        self.asked: list[dict[str, Any]] = []
        self.said: list[str] = []
        self.head = types.SimpleNamespace(name="spark-1")
        vllm = types.SimpleNamespace(port=30000)
        self.cluster = types.SimpleNamespace(name="qwen35", vllm=vllm, served_model_name=MODEL)

    def one_off(self, node: object, probe: list[str], **options: Any) -> object:
        self.asked.append({"probe": probe, **options})
        found = self.answers.pop(0)
        if isinstance(found, Exception):
            raise found
        return found

    def tail(self, node: object, service: str, lines: int) -> str:
        return "[ALERT]    (1) : Starting frontend api: cannot bind socket (Address in use)"

    def report(self, line: str) -> None:
        self.said.append(line)


@pytest.fixture(autouse=True)
def no_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("generator.nodes.door.time.sleep", lambda _: None)


def test_the_door_asked_as_a_client_with_the_key_mounted_read_only() -> None:
    fleet = FakeFleet({MODEL: None})
    door.answers(cast(Fleet, fleet))
    [asked] = fleet.asked
    assert asked["probe"] == ["vllm-compose-health", "models", "--port", "30000"]
    assert asked["networks"] == ["host"] and asked["user"] == "0"
    assert asked["volumes"] == [
        ("/var/lib/vllm-compose/qwen35/api-key", "/run/secrets/api_key", "ro")
    ]
    assert fleet.said == ["front door: spark-1: answers on port 30000"]


def test_a_door_still_on_its_old_keys_is_asked_again() -> None:
    """The worker before the reload may take the first question, with the keys before it."""
    fleet = FakeFleet(OLD_KEYS, {MODEL: None})
    door.answers(cast(Fleet, fleet))
    assert len(fleet.asked) == 2 and fleet.said[-1].endswith("answers on port 30000")


def test_a_door_that_never_answers_fails_the_phase_with_its_log() -> None:
    fleet = FakeFleet(REFUSED, REFUSED, REFUSED)
    with pytest.raises(PhaseError) as failed:
        door.answers(cast(Fleet, fleet))
    assert len(fleet.asked) == door.ASKED
    error = failed.value
    assert error.phase == "front door" and error.node == "spark-1"
    assert error.what == (
        f"phase 'front door' failed: the front door does not answer for {MODEL} on port 30000: "
        "models failed: <urlopen error [Errno 111] Connection refused>"
    )
    assert "cannot bind socket" in error.detail and "front-door on spark-1" in error.detail
    assert fleet.said == []


def test_a_door_without_this_model_in_its_list_fails_the_phase() -> None:
    other = {"/models/other": None}
    fleet = FakeFleet(other, other, other)
    with pytest.raises(PhaseError, match=r"it lists \['/models/other'\]"):
        door.answers(cast(Fleet, fleet))
