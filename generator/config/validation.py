"""Reading a config's YAML and explaining why it is invalid: one line per problem, each naming
the field by its dotted path. Knows no model: the root model and the hints come in."""

from __future__ import annotations

import re
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from generator.base.errors import ConfigError

MAX_BYTES = 1 << 20  # a config is a few hundred bytes; anything near this is not one
MAX_DEPTH = 16  # the schema nests 4 levels deep


class _Loader(yaml.SafeLoader):
    """Safe YAML with limits: no anchors or aliases (nine levels of aliases expand to billions
    of nodes), no nesting deeper than MAX_DEPTH, only plain scalars as keys, no key twice (PyYAML
    keeps the last of two equal keys; a config with one is almost always a mistake)."""

    _depth = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            raise _error(
                "anchors and aliases (&name, *name) are not supported; write it out", event
            )
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _error(f"nested deeper than {MAX_DEPTH} levels", event)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _error(problem: str, event: yaml.Event) -> yaml.MarkedYAMLError:
    return yaml.MarkedYAMLError(problem=problem, problem_mark=event.start_mark)  # type: ignore[arg-type]


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        mark = key_node.start_mark
        if not isinstance(key_node, yaml.ScalarNode):
            raise yaml.MarkedYAMLError(problem="a key must be a plain value", problem_mark=mark)
        key = loader.construct_object(key_node)
        if key in seen:
            raise yaml.MarkedYAMLError(problem=f"duplicate key '{key}'", problem_mark=mark)
        seen.add(key)
    return loader.construct_mapping(node)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)

# Python reads at most 4,300 digits; the fields then name a number out of their range.
DECIMAL = re.compile(r"[-+]?(0|[1-9][0-9]{0,3999})")


def _construct_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    """Integers in plain decimal only: YAML 1.1 reads 010 as 8, 0x1F as 31 and 1_000 as 1000,
    and a 5,000-digit one as a traceback."""
    text = str(node.value)
    if not DECIMAL.fullmatch(text):
        problem = f"{text[:24]}{'...' if len(text) > 24 else ''} is not a plain decimal integer"
        hint = "; write it in decimal without leading zeros" if len(text) <= 4000 else ""
        raise yaml.MarkedYAMLError(problem=problem + hint, problem_mark=node.start_mark)
    return int(text)


_Loader.add_constructor("tag:yaml.org,2002:int", _construct_int)


def read_yaml(text: str, source: str) -> dict[str, Any]:
    """The mapping a config file holds, or a ConfigError saying where it is not one."""
    if len(text.encode()) > MAX_BYTES:
        raise ConfigError(source, [f"the file is over {MAX_BYTES >> 20} MiB"])
    try:
        data = yaml.load(text, Loader=_Loader)
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
        elif not where:
            lines.append("the file must hold a mapping of the fields below its top level")
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
