"""A check's verdict on one node: what preflight prints, one line each."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Status = Literal["pass", "fail", "skip"]


@dataclass(frozen=True)
class Check:
    """One check on one node; a failure says its cause and a hint."""

    name: str
    node: str
    status: Status
    cause: str = ""
    hint: str = ""

    def line(self) -> str:
        text = f"{self.status:4}  {self.name:13} {self.node:12} {self.cause}"
        return text + (f"  (hint: {self.hint})" if self.hint else "")


def passed(name: str, node: str, what: str) -> Check:
    return Check(name, node, "pass", what)


def failed(name: str, node: str, cause: str, hint: str) -> Check:
    return Check(name, node, "fail", cause, hint)


def skipped(name: str, node: str, why: str) -> Check:
    return Check(name, node, "skip", why)
