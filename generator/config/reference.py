"""The config reference (docs/reference.md) and JSON schema, both from the models' field
descriptions."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from generator.config import Cluster


def schema() -> str:
    return json.dumps(Cluster.model_json_schema(), indent=2, sort_keys=True) + "\n"


def markdown() -> str:
    rows = ["| key | default | description |", "| --- | --- | --- |"]
    rows += _rows(Cluster, "")
    return "\n".join(rows) + "\n"


def _rows(model: type[BaseModel], prefix: str) -> list[str]:
    rows = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        inner = _nested(field.annotation)
        list_marker = "[]" if getattr(field.annotation, "__origin__", None) is list else ""
        rows.append(f"| `{key}{list_marker}` | {_default(field)} | {field.description} |")
        if inner:
            rows += _rows(inner, f"{key}{list_marker}.")
    return rows


def _nested(annotation: Any) -> type[BaseModel] | None:
    for candidate in (annotation, *getattr(annotation, "__args__", ())):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _default(field: Any) -> str:
    if field.default is PydanticUndefined and field.default_factory is None:
        return "required"
    if field.default_factory is not None or field.default is None:
        return "—"
    return f"`{json.dumps(field.default)}`"
