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
from generator.stack import doorfiles

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


def test_an_up_rewrites_the_routes_to_the_doors_it_looked_at_and_keeps_what_it_did_not() -> None:
    """A door on spark2 (10.0.0.2) knew, from another cluster's `up`, of `far`'s door on spark3
    (10.0.0.3), which this cluster's `up` (spark1 and spark2) cannot look at: kept. Its route to
    a door on spark1 that is gone, and to its own vLLM, are as this `up` saw them."""
    had = doorfiles.Known(
        [
            doorfiles.Route("away", 8401),  # its own, on its node's loopback
            doorfiles.Route("far", 30002, "10.0.0.3"),  # learnt from far's `up`
            doorfiles.Route("old", 30000, "10.0.0.1"),  # a door on spark1, gone since
        ],
        {"away": "a" * 64, "far": "f" * 64, "ours": "0" * 64},
    )
    text = doorfiles.routes_map(had.routes)
    h = doorfiles.key  # each model by its name's hex: a map key HAProxy reads whole
    assert text == f"{h('away')} 8401\n{h('far')} 10.0.0.3:30002\n{h('old')} 10.0.0.1:30000\n"
    assert doorfiles.read_routes(text + "a line of another shape\n") == had.routes
    seen = doorfiles.Known(
        [doorfiles.Route("away", 8401), doorfiles.Route("ours", 30000, "10.0.0.1")],
        {"away": "a" * 64, "ours": "1" * 64},  # ours's key changed with its API key
    )
    now = doorfiles.merged(had, seen, {"10.0.0.1", "10.0.0.2"}, gone=None)
    assert [r.model for r in now.routes] == ["away", "far", "ours"]
    assert now.peers == {"away": "a" * 64, "far": "f" * 64, "ours": "1" * 64}
    # Ours's `down`: its door is not seen, nor let in any more; far's stays.
    after = doorfiles.merged(now, doorfiles.Known(seen.routes[:1], {"away": "a" * 64}),
                             {"10.0.0.1", "10.0.0.2"}, gone="ours")  # fmt: skip
    assert [r.model for r in after.routes] == ["away", "far"]
    assert after.peers == {"away": "a" * 64, "far": "f" * 64}
