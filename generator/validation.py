"""Reading a config's YAML and explaining why it is invalid: one line per problem, each naming
the field by its dotted path. Knows no model: the root model and the hints come in."""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from generator.errors import ConfigError


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML keeps the last of two equal keys; a config with one is almost always a mistake."""


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            mark = key_node.start_mark
            raise yaml.MarkedYAMLError(problem=f"duplicate key '{key}'", problem_mark=mark)
        seen.add(key)
    return loader.construct_mapping(node)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def read_yaml(text: str, source: str) -> dict[str, Any]:
    """The mapping a config file holds, or a ConfigError saying where it is not one."""
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise ConfigError(source, [f"{where}{e.problem}"]) from None
    except yaml.YAMLError as e:
        raise ConfigError(source, [f"not valid YAML: {e}"]) from None
    if not isinstance(data, dict):
        raise ConfigError(source, ["the file must hold a mapping (name: ..., nodes: ...)"])
    return data


def problems(error: ValidationError, root: type[BaseModel], hints: dict[str, str]) -> list[str]:
    """One line per problem; `hints` explain a pattern mismatch, per pattern."""
    lines = []
    for err in error.errors(include_url=False):
        where = ".".join(str(part) for part in err["loc"])
        if err["type"] == "value_error" and not where:
            lines += str(err["ctx"]["error"]).splitlines()
        elif err["type"] == "extra_forbidden":
            lines.append(f"{where}: unknown key{_known_keys(root, err['loc'])}")
        else:
            lines.append(f"{where}: {_message(err, hints)}")
    return lines


def _message(err: Any, hints: dict[str, str]) -> str:
    shown = repr(err["input"])[:80]
    if err["type"] == "value_error":
        return str(err["ctx"]["error"])
    if err["type"] == "string_pattern_mismatch":
        pattern = err["ctx"]["pattern"]
        return f"{shown} is not allowed: {hints.get(pattern, 'must match ' + pattern)}"
    if err["type"] == "string_type" and isinstance(err["input"], int | float | bool):
        return f"expected a string, got {shown}; quote it in the YAML"
    return str(err["msg"])


def _known_keys(root: type[BaseModel], loc: tuple[int | str, ...]) -> str:
    model = root
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        annotation = model.model_fields[str(part)].annotation
        inner = getattr(annotation, "__args__", (annotation,))[0]
        if not (isinstance(inner, type) and issubclass(inner, BaseModel)):
            return ""
        model = inner
    return f" (known: {', '.join(model.model_fields)})"
