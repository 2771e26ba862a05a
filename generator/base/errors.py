"""Every error vllm-compose raises on purpose.

VllmComposeError            one line, plus an optional hint; cli.main() prints it and exits
├── ConfigError             the config file is unreadable or invalid (exit 2, nothing written)
├── SecretFileError         a secret file the config names is unusable (exit 2, never shown)
├── OutputError             a rendered file could not be written
├── UnsafePath              a path refused before anything is written: a link, a system folder
├── BadFile                 a file the tool reads is not of its shape (exit 2, its field named)
├── OptionError             a command's options refused before anything runs (exit 2)
├── DockerError             a Docker or Compose call failed on a node (keeps command and stderr)
│   └── PhaseError          a bring-up phase failed or timed out on a node
├── RolledBack              an upgrade's new group failed; the stack before serves again
└── ListedError             a headline and one line per finding
    ├── PreflightError      preflight checks failed
    ├── DriftError          the cluster no longer matches its lock
    └── WatchGaveUp         watch stopped recovering a group; what taking it down did per node
"""

from __future__ import annotations

from pathlib import Path

from python_on_whales import DockerException


class VllmComposeError(Exception):
    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def lines(self) -> list[str]:
        return [self.message] + ([f"hint: {self.hint}"] if self.hint else [])


class ConfigError(VllmComposeError):
    """An invalid config: one line per problem, each naming the field by its dotted path."""

    exit_code = 2

    def __init__(self, source: str, problems: list[str]) -> None:
        super().__init__(f"{source} is invalid:")
        self.problems = problems

    def lines(self) -> list[str]:
        return [self.message] + [f"  {problem}" for problem in self.problems]


class SecretFileError(VllmComposeError):
    exit_code = 2


class OutputError(VllmComposeError):
    pass


class UnsafePath(VllmComposeError):
    exit_code = 2


class BadFile(VllmComposeError):
    exit_code = 2


class OptionError(VllmComposeError):
    exit_code = 2


class RolledBack(VllmComposeError):
    def __init__(self, failed: str, when: str, hint: str | None = None) -> None:
        super().__init__(
            f"upgrade failed: {failed}; rolled back: the stack of {when} serves again", hint
        )


class DockerError(VllmComposeError):
    def __init__(self, node: str, message: str, detail: str = "", hint: str | None = None) -> None:
        super().__init__(f"node '{node}': {message}", hint)
        self.node = node
        self.what = message  # without the node
        self.detail = detail

    @classmethod
    def wrap(cls, node: str, what: str, error: DockerException) -> DockerError:
        """`what` failed on the node: its last line, then the command, exit code and stderr."""
        command = " ".join(map(str, error.docker_command))
        detail = f"command: {command}\nexit code: {error.return_code}\n{error.stderr or ''}"
        return cls(node, f"{what}: {reason(error)}", detail)

    def lines(self) -> list[str]:
        tail = [f"  {line}" for line in self.detail.splitlines() if line.strip()]
        return [*super().lines(), *tail]


class PhaseError(DockerError):
    def __init__(
        self, node: str, phase: str, message: str, detail: str = "", hint: str | None = None
    ) -> None:
        super().__init__(node, f"phase '{phase}' failed: {message}", detail, hint)
        self.phase = phase


class ListedError(VllmComposeError):
    """A headline, one indented line per finding, then the hint."""

    def __init__(self, message: str, findings: list[str], hint: str) -> None:
        super().__init__(message, hint)
        self.findings = findings

    def lines(self) -> list[str]:
        return [self.message, *(f"  {line}" for line in self.findings), f"hint: {self.hint}"]


class PreflightError(ListedError):
    def __init__(self, failures: list[str], seconds: float) -> None:
        n = len(failures)
        super().__init__(
            f"preflight: {n} check{'s' if n != 1 else ''} failed in {seconds:.1f} s",
            failures,
            "fix these, or skip them with --skip-preflight",
        )


class DriftError(ListedError):
    def __init__(self, what: list[str], lock: Path) -> None:
        super().__init__(
            f"{lock.name}: the cluster no longer matches its lock:",
            what,
            "make it match again, or accept the change with --update-lock",
        )


class WatchGaveUp(ListedError):
    def __init__(self, recoveries: int, problem: str, down: dict[str, str]) -> None:
        super().__init__(
            f"watch: gave up after {recoveries} recoveries in a row; last problem: {problem}",
            [f"{node}: {outcome}" for node, outcome in down.items()],
            "fix the cause, then start the group again: vllm-compose up CONFIG --watch",
        )


def reason(error: BaseException) -> str:
    """One line saying why: a Docker call's last line of stderr (else stdout, else its exit
    code), one of ours' message, or the exception's own text."""
    if isinstance(error, DockerException):
        text = (error.stderr or "").strip() or (error.stdout or "").strip()
        return last_line(text) if text else f"exit code {error.return_code}, no output"
    if isinstance(error, VllmComposeError):
        return error.message
    return str(error) or type(error).__name__


def last_line(text: str | None) -> str:
    lines = [line for line in (text or "").splitlines() if line.strip()]
    return lines[-1].strip() if lines else "no output"
