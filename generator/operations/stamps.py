"""Which model files each node held, by size and mtime, when `verify` last hashed them and found
them right: preflight names a file whose size or mtime has changed since (one byte flipped in
place changes its mtime) without hashing the model again. Kept in the config's state folder as
model-stamps.json; a file the tool writes and may rewrite, never the user's."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ValidationError

from generator.base import sidefiles
from generator.base.errors import UnsafePath
from generator.stack.output import write_atomic

Stamp = tuple[int, int]  # (size, mtime in ns)
Recorded = dict[str, Stamp]  # relative file -> its stamp when verify hashed it right


class Stamps(BaseModel):
    model: str  # the model path they were taken of
    nodes: dict[str, Recorded]


def path_for(config: Path) -> Path:
    return sidefiles.Beside(config).stamps


def read(config: Path, model: str) -> Stamps | None:
    """The stamps of this model path; None when there are none (or they are of another path,
    or unreadable: they only ever spare a hash, so without them preflight checks sizes alone)."""
    try:
        found = Stamps.model_validate_json(sidefiles.read(path_for(config)))
    except (OSError, ValueError, ValidationError, UnsafePath):
        return None
    return found if found.model == model else None


def record(config: Path, model: str, taken: dict[str, Recorded | None]) -> Path:
    """Node -> its stamps (None: forget that node's, its files were not right), merged into
    what is recorded for the other nodes."""
    found = read(config, model) or Stamps(model=model, nodes={})
    for node, stamps in taken.items():
        if stamps is None:
            found.nodes.pop(node, None)
        else:
            found.nodes[node] = stamps
    path = sidefiles.ready(path_for(config))
    write_atomic(path, json.dumps(found.model_dump(mode="json"), indent=1, sort_keys=True) + "\n")
    return path


def changed(
    path: str, recorded: Recorded, sizes: dict[str, int], mtimes: dict[str, int]
) -> str | None:
    """What changed among the files recorded as hashed right: their size or mtime differs now,
    or they are gone. None when nothing did."""
    names = sorted(
        name
        for name, (size, mtime) in recorded.items()
        if sizes.get(name) != size or mtimes.get(name) != mtime
    )
    if not names:
        return None
    more = f" and {len(names) - 1} more" if len(names) > 1 else ""
    return f"{path}: {names[0]}{more} changed since verify hashed it (size or mtime)"


HINT = "vllm-compose verify CONFIG hashes every file; sync-model CONFIG copies them again"
