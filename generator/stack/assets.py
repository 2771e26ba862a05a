"""Where the templates and the wrapper image's build context are, installed or in a checkout."""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).parent.parent  # generator/
# A wheel carries them in generator/_assets (pyproject.toml); a checkout has them at the top.
ROOT = _PACKAGE / "_assets" if (_PACKAGE / "_assets").is_dir() else _PACKAGE.parent
TEMPLATES = ROOT / "templates"
# Files of the wrapper image's build context, relative to ROOT (as the Dockerfile's COPY expects).
IMAGE_FILES = (
    "Dockerfile",
    "image/entrypoint.sh",
    "image/health.py",
    "image/answers.py",
    "image/canary.py",
    "image/facts.py",
    "image/gpus.py",
    "image/group.py",
    "image/raychecks.py",
    "image/stopping.py",
    "image/transfer.py",
)
