"""Group semantics across nodes for the containers of one cluster (standard library only).

A multi-node vLLM group works only while every member is the one it started with: a rank whose
peer restarted (a reboot, a crash) keeps serving a broken group, or hangs. Each container runs its
command under `supervise`, which keeps it in step with the group:

- every member publishes an incarnation (new at each start of its command) and the incarnation of
  the root it joined, on a small TCP listener (`listen`);
- the root (the head's Ray, or the head's rank for the native backend) follows no one; every other
  member follows the root, and the head's serve also follows the members it drives (`members`);
- before its command starts, a member waits for its root (and `wait_for`, a TCP port such as the
  head's GCS) and for its members to have joined that root: after a reboot the group forms again
  in order, with no command run;
- while it runs, a root or member that restarted, or that did not answer for `grace` seconds,
  breaks the group: the command is stopped, its engine and ranks first so that vLLM's API server
  answers what it holds with an error (image/stopping.py), and started again behind the same
  waits;
- a command that exits by itself is started again after a back-off that doubles from 5 s to 60 s
  (reset after 5 minutes of running), said in a line `up` reads as the start's failure; unless a
  peer is gone (vLLM exits when a rank of its group dies): then at once, behind the same waits;
- the head's serve also runs a canary (`canary`): once it has answered after a start, failing for
  `canary.limit` seconds breaks the group, so the nodes re-form it after a hung rank by themselves.

The container restarts only with its node (the Compose restart policy), so a serve that shares
its Ray container's process namespace never loses it to a restart of Ray.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from canary import Canary
from stopping import stop, stop_broken

POLL = 1.0  # seconds between looks at the root and members while the command runs
FORM_POLL = 0.2  # the same while waiting for the group to form: every start waits on it
CONNECT = 0.5  # seconds a look may take (the private link answers in well under a millisecond)
BACKOFF = (5, 60)  # first and longest pause before a command that exited is started again
STEADY = 300  # seconds of running after which a command's exit counts as its first failure
# The lines `up` reads (generator/base/probes.py has the same words): the command started, and the
# command exited by itself (a failed start, while a back-off runs). `watch` reads the next two
# (generator/nodes/events.py has the same words): a peer fell silent, and the group broke.
STARTING = "starting"
EXITED = "exited with code"
SILENT = "stopped answering"
BROKE = "the group broke:"


def say(message: str) -> None:
    print(f"vllm-compose: {message}", file=sys.stderr, flush=True)


@dataclass
class Member:
    """This container's place in the group: what it publishes and whom it follows."""

    listen: tuple[str, int] | None
    root: tuple[str, int] | None
    members: list[tuple[str, int]]
    grace: float
    wait_for: tuple[str, int] | None = None
    canary: Canary | None = None
    incarnation: str = ""
    joined: str = ""  # the root's incarnation this member follows (its own, for the root)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stopping: threading.Event = field(default_factory=threading.Event)  # SIGTERM or SIGINT came

    def published(self) -> bytes:
        with self.lock:
            return f"{self.incarnation} {self.joined}\n".encode()


def address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def ask(peer: tuple[str, int]) -> tuple[str, str] | None:
    """A peer's (incarnation, joined), or None when it does not answer."""
    try:
        with socket.create_connection(peer, timeout=CONNECT) as conn:
            conn.settimeout(CONNECT)
            words = conn.recv(256).decode(errors="replace").split()
    except OSError:
        return None
    return (words[0], words[1]) if len(words) == 2 else None


def serve_incarnation(member: Member, server: socket.socket) -> None:
    """Answer every connection with this member's incarnation and joined root; forever."""
    while True:
        conn, _ = server.accept()
        with conn:
            try:
                conn.sendall(member.published())
            except OSError:
                continue


def wait_until(member: Member, what: str, ready: Callable[[], bool]) -> bool:
    """Call `ready` every FORM_POLL seconds until it returns true (said at once when it is not,
    then every 30 s); False when the member is told to stop first."""
    start, said = time.monotonic(), None
    while not ready():
        if said is None or time.monotonic() - said >= 30:
            elapsed = f" ({time.monotonic() - start:.0f} s)" if said else ""
            say(f"waiting for {what}{elapsed}")
            said = time.monotonic()
        if member.stopping.wait(FORM_POLL):
            return False
    return True


def form(member: Member) -> dict[tuple[str, int], str]:
    """Wait for the group this start belongs to; the members' incarnations to follow."""
    group = member.incarnation
    if member.root:
        root = member.root
        if not wait_until(member, f"the head at {_name(root)}", lambda: ask(root) is not None):
            return {}
        answer = ask(root)
        group = answer[0] if answer else ""
    with member.lock:
        member.joined = group
    if member.wait_for:
        target = member.wait_for
        if not wait_until(
            member, f"{_name(target)} to accept connections", lambda: _reachable(target)
        ):
            return {}
    seen: dict[tuple[str, int], str] = {}

    def all_joined() -> bool:
        for peer in member.members:
            answer = ask(peer)
            if answer and answer[1] == group:
                seen[peer] = answer[0]
        return len(seen) == len(member.members)

    if member.members:
        names = ", ".join(_name(p) for p in member.members)
        wait_until(member, f"every member to join ({names})", all_joined)
    return seen


def broken(member: Member, seen: dict[tuple[str, int], str], silent: dict[str, float]) -> str:
    """Why the group this start belongs to is gone ('' while it holds). `silent`: since when
    each peer has not answered."""
    for peer, expected in _peers(member, seen):
        answer = ask(peer)
        name = _name(peer)
        if answer is None:
            if name not in silent:
                say(f"{name} {SILENT}; the group breaks if it stays silent {member.grace:g} s")
            since = silent.setdefault(name, time.monotonic())
            if time.monotonic() - since >= member.grace:
                return f"{name} has not answered for {member.grace:g} s"
            continue
        if silent.pop(name, None) is not None:
            say(f"{name} answers again")
        if answer[0] != expected:
            return f"{name} started again"
    return ""


def run(member: Member, command: list[str]) -> int:
    """Start `command` in the group, again and again; returns only on SIGTERM or SIGINT."""
    stopping = member.stopping
    child: list[subprocess.Popen[bytes]] = []

    def on_signal(signum: int, _frame: object) -> None:
        stopping.set()
        if child:
            stop(child[0], signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if member.listen and not _listening(member, member.listen):
        return 1
    failures = 0
    while not stopping.is_set():
        with member.lock:
            member.incarnation = secrets.token_hex(8)
        seen = form(member)
        if stopping.is_set():
            break
        started = time.monotonic()
        say(f"{STARTING} {command[0]} (start {member.incarnation})")
        proc = subprocess.Popen(command, start_new_session=True)
        child[:] = [proc]
        why = _supervise(member, proc, seen)
        child.clear()
        if stopping.is_set():
            return proc.wait()
        if why:
            say(f"{BROKE} {why}; stopping {command[0]} to start it with the group again")
            stop_broken(proc)
            continue
        if why := _peer_lost(member, seen):  # it exited because its group broke: no back-off
            say(f"{BROKE} {why}; {command[0]} exited with it ({proc.returncode}), starting again")
            continue
        failures = _back_off(command[0], proc.returncode, time.monotonic() - started, failures)
        stopping.wait(min(BACKOFF[1], BACKOFF[0] * 2 ** (failures - 1)))
    return 0


def _peers(member: Member, seen: dict[tuple[str, int], str]) -> list[tuple[tuple[str, int], str]]:
    """The root this start joined and the members it follows, each with its known incarnation."""
    return [*([(member.root, member.joined)] if member.root else []), *seen.items()]


def _peer_lost(member: Member, seen: dict[tuple[str, int], str]) -> str:
    """A peer that started again or does not answer now ('' when none): the group is gone."""
    for peer, expected in _peers(member, seen):
        answer = ask(peer)
        if answer is None or answer[0] != expected:
            return f"{_name(peer)} {'does not answer' if answer is None else 'started again'}"
    return ""


def _listening(member: Member, listen: tuple[str, int]) -> bool:
    """Publish this member's incarnation on `listen`, from a thread; False (said) if it cannot."""
    try:
        server = socket.create_server(listen)
    except OSError as e:
        say(f"cannot listen on {_name(listen)} (the config's group.port): {e}")
        return False
    threading.Thread(target=serve_incarnation, args=(member, server), daemon=True).start()
    return True


def _back_off(name: str, code: int, ran: float, failures: int) -> int:
    """Say the command exited by itself; the count of failures in a row, this one included."""
    failures = 1 if ran >= STEADY else failures + 1
    pause = min(BACKOFF[1], BACKOFF[0] * 2 ** (failures - 1))
    say(f"{name} {EXITED} {code} after {ran:.0f} s; starting it again in {pause} s ({failures})")
    return failures


def _supervise(
    member: Member, proc: subprocess.Popen[bytes], seen: dict[tuple[str, int], str]
) -> str:
    """Watch the group while the command runs: why it broke, or '' when the command ended."""
    silent: dict[str, float] = {}
    if member.canary:
        member.canary.restart()
    while proc.poll() is None and not member.stopping.is_set():
        why = broken(member, seen, silent) or (member.canary.verdict() if member.canary else "")
        if why:
            return why
        try:
            proc.wait(POLL)
        except subprocess.TimeoutExpired:
            continue
    return ""


def _reachable(target: tuple[str, int]) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(target, timeout=CONNECT):
        return True
    return False


def _name(peer: tuple[str, int]) -> str:
    return f"{peer[0]}:{peer[1]}"


def from_environment() -> Member | None:
    """The member the rendered stack describes in VLLM_COMPOSE_GROUP_*; None outside a group."""
    env = os.environ
    listen, root = env.get("VLLM_COMPOSE_GROUP_LISTEN"), env.get("VLLM_COMPOSE_GROUP_ROOT")
    if not listen and not root:
        return None
    members = [address(a) for a in env.get("VLLM_COMPOSE_GROUP_MEMBERS", "").split(",") if a]
    wait_for, grace = env.get("VLLM_COMPOSE_WAIT_FOR"), env.get("VLLM_COMPOSE_GROUP_GRACE", "10")
    return Member(
        listen=address(listen) if listen else None, root=address(root) if root else None,
        members=members, grace=float(grace), wait_for=address(wait_for) if wait_for else None,
    )  # fmt: skip
