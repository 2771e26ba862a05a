"""Writing rendered files: a plan (create / identical / overwrite), diffs, and an atomic apply."""

from __future__ import annotations

import difflib
import os
import tempfile
from pathlib import Path
from typing import Literal, NamedTuple

from generator.base import sidefiles
from generator.base.errors import OutputError, UnsafePath
from generator.stack.render import File

Action = Literal["create", "identical", "overwrite"]


class Change(NamedTuple):
    """What writing one rendered file does; `old` is what the file held (None: it is new)."""

    path: Path
    action: Action
    file: File
    old: str | None

    def diff(self) -> str:
        if self.file.secret:
            return ""  # a secret's contents are never shown
        old = (self.old or "").splitlines(keepends=True)
        before = f"a/{self.path}" if self.old is not None else "/dev/null"
        lines = difflib.unified_diff(
            old, self.file.text.splitlines(keepends=True), before, f"b/{self.path}"
        )
        return "".join(lines)


# Output folders refused: these folders themselves, and anything under the second set.
SYSTEM = {"/", "/bin", "/boot", "/etc", "/home", "/lib", "/lib64", "/run", "/sbin", "/usr", "/var"}
SYSTEM_TREES = ("/boot", "/dev", "/etc", "/proc", "/sys", "/usr", "/var/lib/docker")


def check_folder(outdir: Path) -> None:
    """Refuse, before anything is written (secrets are generated before the plan: this comes
    first), an output folder that is a system folder or not a folder, or that holds a link
    where node folders, their secrets/ and files go."""
    real = outdir.resolve()
    if str(real) in SYSTEM or any(real == Path(t) or Path(t) in real.parents for t in SYSTEM_TREES):
        raise UnsafePath(f"-o {outdir}: {real} is a system folder", "choose a folder of your own")
    if outdir.exists() and not outdir.is_dir():
        raise UnsafePath(f"-o {outdir} is not a folder", "choose a folder, or a new name")
    for top, folders, files in os.walk(outdir):
        depth = len(Path(top).relative_to(outdir).parts)
        for name in [*folders, *files]:
            _no_link(outdir, Path(top) / name)
        if depth >= 2:  # NODE/secrets/FILE is as deep as the tool writes
            folders.clear()


def _no_link(outdir: Path, path: Path) -> None:
    """Nothing is written, chmodded or shown through a link inside the output folder: a node
    folder, its secrets/ or a file that is a link is refused, naming it."""
    current = outdir
    for part in path.relative_to(outdir).parts:
        current = current / part
        if current.is_symlink():
            raise UnsafePath(
                f"{current} is a link; vllm-compose writes, shows and chmods nothing through one",
                f"remove the link (rm {current}) or choose another -o",
            )


def plan(files: dict[str, File], outdir: Path) -> list[Change]:
    check_folder(outdir)
    changes = []
    for rel, file in sorted(files.items()):
        path = outdir / rel
        _no_link(outdir, path)
        old = _read(path)
        action: Action = (
            "create" if old is None else "identical" if old == file.text else "overwrite"
        )
        if action == "identical" and path.stat().st_mode & 0o777 != file.mode:
            action = "overwrite"
        changes.append(Change(path, action, file, old))
    return changes


def stale(files: dict[str, File], outdir: Path) -> list[Path]:
    """Node folders in outdir that the config no longer names; reported, never deleted."""
    nodes = {rel.split("/", 1)[0] for rel in files}
    if not outdir.is_dir():
        return []
    return sorted(p for p in outdir.iterdir() if p.is_dir() and p.name not in nodes)


def apply(changes: list[Change]) -> None:
    """Write every changed file to a temporary sibling first, then rename them all into place,
    so a failure leaves the old files, never a half-written one."""
    pending: list[tuple[str, Path]] = []
    try:
        for change in changes:
            if change.action != "identical":
                pending.append((_stage(change), change.path))
        for tmp, path in pending:
            Path(tmp).replace(path)
    except OSError as e:
        for tmp, _ in pending:
            Path(tmp).unlink(missing_ok=True)
        raise OutputError(f"cannot write {e.filename}: {e.strerror}") from None


def _stage(change: Change) -> str:
    change.path.parent.mkdir(parents=True, exist_ok=True)
    if change.file.secret:
        change.path.parent.chmod(0o700)
    return stage(change.path, change.file.text, change.file.mode)


def stage(path: Path, text: str, mode: int = 0o644) -> str:
    """`text` in a temporary sibling of `path` (its mode set before anything is written);
    renaming it over `path` is the atomic step."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.fchmod(fd, mode)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    return tmp


def write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """A reader sees the old file or the new one, never half of one. A file that is a link is
    refused, not replaced; its folder is the caller's to check (sidefiles.folder): the config's
    own folder may be a link the user made."""
    Path(stage(sidefiles.not_a_link(path), text, mode)).replace(path)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        raise OutputError(f"cannot read {path}: {e}", "move it away or choose another -o") from None
