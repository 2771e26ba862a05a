"""Name why a service failed from its log, so the error says the cause instead of "exited (1)".

vLLM logs the root cause first and then a chain of wrappers ("Engine core initialization failed.
See root cause above"), so the first exception line of the log is the one to show.
"""

from __future__ import annotations

import re

# vLLM's prefix: "(EngineCore pid=327) ERROR 11-30 10:07:08 [core.py:1510] "; then a traceback's
# last line, which starts the (rest of the) line: a warning quoting an error name does not count.
PREFIX = r"^(?:\(\w+ pid=\d+\)\s+)?(?:[A-Z]+ \d\d-\d\d [\d:]+ \[[^\]]+\]\s+)?"
EXCEPTION = re.compile(PREFIX + r"((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception)): (\S.*)$")


def cause(log: str) -> str | None:
    """The first exception line in the log ("ValueError: ..."), or None."""
    for line in log.splitlines():
        found = EXCEPTION.match(line)
        if found:
            return f"{found.group(1)}: {found.group(2).strip()}"
    return None
