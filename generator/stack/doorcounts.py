"""The front door's counts per key: mtail (a log-to-metrics tool, kept by its author) on the head
reads the door's log lines and serves, for Prometheus, requests by key, model and status, the
prompt and generated tokens of every answer that carries its usage, the answers vLLM broke off
under way, and with replicas the requests each one answered, by status.

- The door sends each log line to mtail over UDP on the head's loopback (as well as to its own
  output, for `logs`); mtail answers Prometheus on the loopback too (key names are not for the
  private link).
- Tokens: the door reads `usage` from a whole JSON answer (stream: false), and from a streamed
  answer's last event, which the door asks vLLM for when the request did not
  (stack/doorusage.py); a stream whose request said `stream_options` without asking is counted
  as a request, with no tokens (the log line says `tokens=-/-`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from generator.config import ports
from generator.stack.monitoring import Sidecar

if TYPE_CHECKING:
    from generator.stack import NodeStack

CONFIG = "front-door-counts"  # its Compose config: the mtail program
PROGRAM_DIR = "/etc/mtail"
PROGRAM_FILE = f"{PROGRAM_DIR}/front-door.mtail"

# One line a request, as frontdoor.LOG_FORMAT writes it: `option httplog`'s fields (the status
# follows the five times; three fields on, the termination state), then key, model and tokens,
# last. The line is matched from both ends: what a client sent (the request line, the model)
# cannot pose as a field of ours. In the model's label the door's JSON escape of a slash is undone
# (model paths have them); other escapes stay. An answer cut: its state is `SD` (the server side
# ended it while its data was under way), whatever its status, which went out before.
PROGRAM = r"""# vllm-compose: the front door's log lines -> counts per key and model.
counter front_door_requests_total by key, model, code
counter front_door_prompt_tokens_total by key, model
counter front_door_generation_tokens_total by key, model
counter front_door_answers_cut_total by key, model

/^\S+ \[[^\]]*\] \S+ \S+ -?\d+\/-?\d+\/-?\d+\/-?\d+\/\+?\d+ (?P<code>\d{3}) / {
  /key="(?P<key>[^"]*)" model="(?P<model>(?:[^"\\]|\\.)*)" tokens=\S+$/ {
    front_door_requests_total[$key][subst("\/", "/", $model)][$code]++
    / tokens=(?P<prompt>\d+)\/(?P<generated>\d+)$/ {
      front_door_prompt_tokens_total[$key][subst("\/", "/", $model)] += $prompt
      front_door_generation_tokens_total[$key][subst("\/", "/", $model)] += $generated
    }
    /^\S+ \[[^\]]*\] \S+ \S+ \S+ \d{3} \S+ \S+ \S+ SD/ {
      front_door_answers_cut_total[$key][subst("\/", "/", $model)]++
    }
  }
}
"""
# With replicas: the requests each replica answered, by status (the line's `backend/server`).
REPLICAS = (
    "\ncounter front_door_replica_requests_total by replica, code\n\n"
    r"/^\S+ \[[^\]]*\] \S+ replicas\/(?P<replica>replica-\d+)"
    r" -?\d+\/-?\d+\/-?\d+\/-?\d+\/\+?\d+ (?P<code>\d{3}) / {"
    "\n  front_door_replica_requests_total[$replica][$code]++\n}\n"
)


def wanted(stack: NodeStack) -> bool:
    """Counted when the door and `metrics` are both on, on the head."""
    c = stack.cluster
    return bool(c.metrics and c.front_door.enabled and stack.is_head)


def program(replicas: int) -> str:
    """The mtail program: the counts per key, and per replica where there are several."""
    return PROGRAM + (REPLICAS if replicas > 1 else "")


def configs(stack: NodeStack) -> dict[str, str]:
    return {CONFIG: program(stack.cluster.replicas)} if wanted(stack) else {}


def sidecars(stack: NodeStack) -> list[Sidecar]:
    """mtail, listening for the door's lines and for Prometheus on the head's loopback."""
    if not wanted(stack):
        return []
    c = stack.cluster
    assert c.metrics is not None
    command = arguments(ports.door_log(c), ports.door_counts(c))
    return [Sidecar("front-door-counts", c.metrics.mtail_image, command,
                    configs=[(CONFIG, PROGRAM_FILE)])]  # fmt: skip


def arguments(log_port: int, port: int, progs: str = PROGRAM_DIR) -> list[str]:
    """mtail's flags: the programs in `progs`, the door's lines on UDP `log_port` and Prometheus
    on `port`, both on the loopback. A poll each millisecond: mtail versions that read one
    datagram a poll (Debian's 3.0.0~rc50) count at most 4 lines a second at the 250 ms default
    (200 lines sent at once: 32 counted after 7 s), and a busy door's lines past that are lost
    from the socket's buffer; at 1 ms all 200 at once (idle, it costs 2% of a core)."""
    return [
        f"--progs={progs}",
        f"--logs=udp://127.0.0.1:{log_port}",
        "--address=127.0.0.1",
        f"--port={port}",
        "--emit_prog_label=false",
        "--logtostderr",
        "--poll_interval=1ms",
    ]
