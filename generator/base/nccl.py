"""Which network NCCL actually used, read from its `NCCL_DEBUG=INFO` lines in a log: the interface
and address of its bootstrap and of its socket transport, the RDMA devices of its IB transport, and
a `NCCL_SOCKET_IFNAME` that matched nothing. (Real NCCL 2.28.9 lines: ../shared/fixtures/.)"""

from __future__ import annotations

import re
from typing import Any

# "NET/Socket : Using [0]eth0:192.0.2.2<0> [1]..." and "Bootstrap: Using lo:127.0.0.1<0>"
SOCKET = re.compile(r"NET/Socket : Using (.+)$")
BOOTSTRAP = re.compile(r"Bootstrap ?: Using (\S+?):(\S+?)<\d+>")
DEVICE = re.compile(r"\[\d+\](\S+?):(\S+?)<\d+>")
# "NET/IB : Using [0]mlx5_0:1/RoCE [RO]; OOB enP2p1s0f1np1:192.168.200.12<0>"
IB = re.compile(r"NET/IB : Using (.+?)(?:; OOB (\S+?):(\S+?)<\d+>)?\s*$")
TRANSPORT = re.compile(r"NCCL INFO Using network (\w+)")
NO_INTERFACE = "Bootstrap : no socket interface found"


def used(log: str) -> dict[str, Any]:
    """What the log says NCCL used; empty lists when it says nothing (NCCL_DEBUG unset)."""
    found: dict[str, Any] = {"transport": [], "bootstrap": [], "socket": [], "ib": [], "errors": []}

    def add(key: str, value: str) -> None:
        if value not in found[key]:
            found[key].append(value)

    for line in log.splitlines():
        if m := TRANSPORT.search(line):
            add("transport", m.group(1))
        elif m := BOOTSTRAP.search(line):
            add("bootstrap", f"{m.group(1)} {m.group(2)}")
        elif m := SOCKET.search(line):
            for name, ip in DEVICE.findall(m.group(1)):
                add("socket", f"{name} {ip}")
        elif m := IB.search(line):
            devices = " ".join(d.strip() for d in re.split(r"\[\d+\]", m.group(1)) if d.strip())
            oob = f" (out of band: {m.group(2)} {m.group(3)})" if m.group(2) else ""
            add("ib", devices + oob)
        elif NO_INTERFACE in line:
            add("errors", "no socket interface found: NCCL_SOCKET_IFNAME matches no interface")
    return found
