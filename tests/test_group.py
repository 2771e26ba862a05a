"""The group supervisor (image/group.py) as real processes on loopback addresses: a root, a
member that follows it, and a head that follows its members; each runs a shell command that
appends a line to a file at every start."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from canary import Canary

HEALTH = Path(__file__).parent.parent / "image" / "health.py"
PORT = 29610


class Supervised:
    """`vllm-compose-health supervise` of a command that counts its starts in `starts`."""

    def __init__(self, folder: Path, name: str, env: dict[str, str], command: str = "") -> None:
        self.starts = folder / f"{name}.starts"
        self.log = (folder / f"{name}.log").open("w")
        command = command or f"echo started >> {self.starts}; exec sleep 600"
        self.proc = subprocess.Popen(
            [sys.executable, str(HEALTH), "supervise", "--", "sh", "-c", command],
            env={**os.environ, "VLLM_COMPOSE_GROUP_GRACE": "3", **env},
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.output = folder / f"{name}.log"

    def count(self) -> int:
        return len(self.starts.read_text().splitlines()) if self.starts.exists() else 0

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def eventually(check: object, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.2)
    raise AssertionError(f"not true within {seconds} s")


@pytest.fixture
def started(tmp_path: Path) -> Iterator[list[Supervised]]:
    running: list[Supervised] = []
    yield running
    for one in running:
        one.stop()


def test_a_member_starts_after_its_root_and_again_whenever_the_root_starts_again(
    tmp_path: Path, started: list[Supervised]
) -> None:
    member = Supervised(tmp_path, "member", {"VLLM_COMPOSE_GROUP_LISTEN": f"127.0.0.2:{PORT}",
                                             "VLLM_COMPOSE_GROUP_ROOT": f"127.0.0.1:{PORT}"})  # fmt: skip
    started.append(member)
    time.sleep(2)
    assert member.count() == 0  # no root yet: it waits
    root = Supervised(tmp_path, "root", {"VLLM_COMPOSE_GROUP_LISTEN": f"127.0.0.1:{PORT}"})
    started.append(root)
    eventually(lambda: member.count() == 1 and root.count() == 1)
    root.stop()
    started.append(
        Supervised(tmp_path, "root2", {"VLLM_COMPOSE_GROUP_LISTEN": f"127.0.0.1:{PORT}"})
    )
    eventually(lambda: member.count() == 2)
    said = member.output.read_text()
    assert f"the group broke: 127.0.0.1:{PORT} " in said, said


def test_a_head_waits_for_its_members_and_starts_again_when_one_does(
    tmp_path: Path, started: list[Supervised]
) -> None:
    head_env = {"VLLM_COMPOSE_GROUP_LISTEN": f"127.0.0.1:{PORT}",
                "VLLM_COMPOSE_GROUP_MEMBERS": f"127.0.0.2:{PORT}"}  # fmt: skip
    member_env = {"VLLM_COMPOSE_GROUP_LISTEN": f"127.0.0.2:{PORT}",
                  "VLLM_COMPOSE_GROUP_ROOT": f"127.0.0.1:{PORT}"}  # fmt: skip
    head = Supervised(tmp_path, "head", head_env)
    started.append(head)
    time.sleep(2)
    assert head.count() == 0  # its member has not joined
    member = Supervised(tmp_path, "member", member_env)
    started.append(member)
    eventually(lambda: head.count() == 1 and member.count() == 1)
    member.stop()  # the member's node goes down and comes back: a new start
    again = Supervised(tmp_path, "again", member_env)
    started.append(again)
    # The head starts again with the new member; the member follows the head's new start.
    eventually(lambda: head.count() == 2 and again.count() >= 1)
    eventually(
        lambda: f"the group broke: 127.0.0.1:{PORT} started again" in again.output.read_text()
    )
    assert f"the group broke: 127.0.0.2:{PORT} started again" in head.output.read_text()


def test_a_member_that_stops_answering_breaks_the_group_after_the_grace(
    tmp_path: Path, started: list[Supervised]
) -> None:
    root = Supervised(tmp_path, "root", {"VLLM_COMPOSE_GROUP_LISTEN": f"127.0.0.1:{PORT}"})
    member = Supervised(tmp_path, "member", {"VLLM_COMPOSE_GROUP_ROOT": f"127.0.0.1:{PORT}"})
    started += [root, member]
    eventually(lambda: member.count() == 1)
    os.killpg(root.proc.pid, signal.SIGKILL)  # the root's node loses power
    eventually(lambda: "has not answered for 3 s" in member.output.read_text(), 15)
    said = member.output.read_text()
    # Said at its first silent look too, well before the break: what watch names a cut link by.
    silent = f"127.0.0.1:{PORT} stopped answering; the group breaks if it stays silent 3 s"
    assert said.index(silent) < said.index("has not answered for 3 s"), said


def test_a_command_that_exits_is_started_again_after_a_back_off(
    tmp_path: Path, started: list[Supervised]
) -> None:
    failing = Supervised(tmp_path, "failing", {"VLLM_COMPOSE_GROUP_LISTEN": f"127.0.0.1:{PORT}"},
                         command=f"echo started >> {tmp_path}/failing.starts; exit 3")  # fmt: skip
    started.append(failing)
    eventually(lambda: "exited with code 3" in failing.output.read_text())
    said = failing.output.read_text()
    assert re.search(r"sh exited with code 3 after [01] s; starting it again in 5 s \(1\)", said)
    time.sleep(2)
    assert failing.count() == 1  # still waiting out its back-off
    eventually(lambda: failing.count() == 2, 10)
    failing.stop()
    assert failing.proc.returncode == 0


def test_a_command_that_exits_with_its_group_is_started_again_without_a_back_off(
    tmp_path: Path, started: list[Supervised]
) -> None:
    """vLLM exits when a rank of its group dies: the member's command ends 2 s after its root
    went (within the grace, so no break came first); no back-off, it waits for the root."""
    root = Supervised(tmp_path, "root", {"VLLM_COMPOSE_GROUP_LISTEN": f"127.0.0.1:{PORT}"})
    member = Supervised(tmp_path, "member", {"VLLM_COMPOSE_GROUP_ROOT": f"127.0.0.1:{PORT}"},
                        command=f"echo started >> {tmp_path}/member.starts; sleep 4; exit 1")  # fmt: skip
    started += [root, member]
    eventually(lambda: member.count() == 1)
    time.sleep(2)
    os.killpg(root.proc.pid, signal.SIGKILL)  # 2 s before the command ends, 3 s of grace
    eventually(lambda: "exited with it" in member.output.read_text(), 15)
    said = member.output.read_text()
    assert f"the group broke: 127.0.0.1:{PORT} does not answer; sh exited with it (1)" in said
    assert "starting it again in" not in said  # no back-off
    assert "waiting for the head at" in said.split("exited with it", 1)[1]


def test_up_reads_the_supervisors_last_line_even_glued_to_the_commands_last_output() -> None:
    from generator.base import probes

    started = "vllm-compose: starting vllm (start 8a36)\nINFO loading"
    assert not probes.exited(started)
    glued = "See https://nanobind.readthedocs.io/en/latest/refleaks.htmlvllm-compose: vllm exited"
    assert probes.exited(f"{started}\n{glued} with code 0 after 24 s; starting it again in 5 s (1)")
    again = "vllm-compose: vllm exited with code 1 after 3 s; ...\nvllm-compose: starting vllm"
    assert not probes.exited(again)


def test_sigterm_while_waiting_for_the_group_stops_at_once(
    tmp_path: Path, started: list[Supervised]
) -> None:
    waiting = Supervised(tmp_path, "waiting", {"VLLM_COMPOSE_GROUP_ROOT": f"127.0.0.1:{PORT}"})
    started.append(waiting)
    time.sleep(1)
    began = time.monotonic()
    waiting.proc.send_signal(signal.SIGTERM)
    assert waiting.proc.wait(10) == 0
    assert time.monotonic() - began < 3 and waiting.count() == 0


def test_a_port_taken_by_another_process_is_said_and_the_supervisor_exits(
    tmp_path: Path, started: list[Supervised]
) -> None:
    with socket.create_server(("127.0.0.1", PORT)):
        taken = Supervised(tmp_path, "taken", {"VLLM_COMPOSE_GROUP_LISTEN": f"127.0.0.1:{PORT}"})
        started.append(taken)
        assert taken.proc.wait(10) == 1
    assert (
        f"cannot listen on 127.0.0.1:{PORT} (the config's group.port)" in taken.output.read_text()
    )


class Served:
    """A stand-in for the head serve's API (only what the canary asks: a completion and
    /metrics), from a thread on loopback. `answering` cleared: completions get no answer (held
    past the canary's timeout); `counting` cleared: vLLM's token counter stands still."""

    def __init__(self) -> None:
        import http.server
        import threading

        served = self
        self.answering, self.counting = threading.Event(), threading.Event()
        self.answering.set()
        self.counting.set()
        self.tokens = 0

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # a completion
                self.rfile.read(int(self.headers["Content-Length"]))
                if not served.answering.is_set():
                    time.sleep(4)  # past the canary's timeout: no answer
                    return
                self._send(b'{"choices": [{"text": "pong"}]}')

            def do_GET(self) -> None:  # /metrics
                served.tokens += served.counting.is_set()
                self._send(f"vllm:generation_tokens_total {served.tokens}.0\n".encode())

            def _send(self, body: bytes) -> None:
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def hang(self) -> None:
        self.answering.clear()
        self.counting.clear()


def test_a_hung_api_breaks_the_group_after_the_canarys_limit_and_only_once_it_answered(
    tmp_path: Path, started: list[Supervised]
) -> None:
    api = Served()
    head = Supervised(tmp_path, "head", {"VLLM_COMPOSE_GROUP_LISTEN": f"127.0.0.1:{PORT}",
                                         "VLLM_COMPOSE_CANARY": f"2 {api.port} tiny"})  # fmt: skip
    started.append(head)
    eventually(lambda: head.count() == 1)
    time.sleep(7)  # answering: the canary is armed, and nothing breaks
    assert head.count() == 1, head.output.read_text()
    api.hang()  # a rank hangs: no completion comes back, vLLM counts no token
    eventually(lambda: head.count() == 2, 30)
    said = head.output.read_text()
    assert "the group broke: its canary failed for 2 s (" in said, said
    time.sleep(12)  # hung from the new start on: never armed, so it waits, as a model load would
    assert head.count() == 2, head.output.read_text()
    api.close()


def said_within(canary: Canary, seconds: float) -> tuple[str, float]:
    """The canary's first verdict naming a hang, asked every 0.1 s for at most `seconds`, and
    how long it took ('' when none came)."""
    began = time.monotonic()
    while time.monotonic() - began < seconds:
        if why := canary.verdict():
            return why, time.monotonic() - began
        time.sleep(0.1)
    return "", seconds


def test_the_canary_counts_a_server_busy_with_real_work_as_alive() -> None:
    """Over the stand-in API: a completion held in a full queue while vLLM counts tokens is
    alive; once the count stands still too, the hang is named about `limit` after it."""
    import health

    api = Served()
    check = health.canary_check(api.port, "tiny", timeout=1)
    canary = Canary(check, health.canary_tokens(api.port, 1), limit=2, every=0.25)
    assert said_within(canary, 1) == ("", 1)  # answered: armed
    assert canary.armed
    api.answering.clear()  # the completion waits in a full queue, but tokens are counted
    assert said_within(canary, 4) == ("", 4)
    api.counting.clear()
    why, after = said_within(canary, 6)
    assert why.startswith("its canary failed for 2 s (no answer, no token counted"), why
    assert 1.5 <= after <= 3.5, after
    api.answering.set()
    api.close()


def test_the_canary_names_a_hang_while_the_completion_sent_before_it_still_waits() -> None:
    """A FAKE completion that hangs (as one sent just before a rank stops) and a count that
    stands still: named `limit` after the last count moved, not after the completion's own
    timeout; and never before the first answer of a start (a model still loading)."""
    waiting = threading.Event()
    answers: list[str | None] = [None]  # the first answers, the next ones hang until released

    def check() -> str | None:
        if answers:
            return answers.pop()
        waiting.wait(30)
        return "timed out"

    count = [0.0]
    canary = Canary(check, lambda: count[0], limit=1.5, every=0.2)
    assert said_within(canary, 1) == ("", 1)
    assert canary.armed
    why, after = said_within(canary, 5)  # nothing moves from here on
    assert why.startswith("its canary failed for 1.5 s"), why
    assert after <= 2.5, after
    canary.restart()  # a new start: not armed again until it answers
    count[0] = 5.0
    assert said_within(canary, 2.5) == ("", 2.5)
    waiting.set()


SERVER = """\
import pathlib, subprocess, sys, time
said = pathlib.Path(sys.argv[1])
engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
said.write_text("serving")
engine.wait()
said.write_text(f"engine gone ({engine.returncode}): error events sent")
if sys.argv[2] == "lingers":
    time.sleep(600)
"""


@pytest.mark.parametrize("after", ["exits", "lingers"])
def test_a_broken_groups_command_loses_its_engine_first_so_it_can_answer_what_it_holds(
    tmp_path: Path, after: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stand-in for vLLM's API server (a fake: the stopping order alone) that starts its engine,
    and says so once the engine is gone; then exits, or lingers and is stopped."""
    import stopping

    monkeypatch.setattr(stopping, "ENGINE_FIRST", 1)
    monkeypatch.setattr(stopping, "BREAK_GRACE", 1)
    said = tmp_path / "said"
    (tmp_path / "server.py").write_text(SERVER)
    server = [sys.executable, str(tmp_path / "server.py"), str(said), after]
    proc = subprocess.Popen(server, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not (said.exists() and len(stopping.members(proc.pid)) == 2):
            assert time.monotonic() < deadline, "the stand-in did not start its engine"
            time.sleep(0.1)
        stopping.stop_broken(proc)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert said.read_text() == "engine gone (-9): error events sent"
    assert proc.returncode == (0 if after == "exits" else -signal.SIGTERM)
    assert stopping.members(proc.pid) == []
