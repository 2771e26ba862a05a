"""The shape of the code the project ships (generator/, image/), checked in CI: small modules and
functions, and every Docker call through python-on-whales."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parent.parent
SHIPPED = sorted([*ROOT.glob("generator/**/*.py"), *ROOT.glob("image/*.py")])
MODULE_LINES, FUNCTION_LINES = 300, 40
# The processes the tool runs of its own, each for a reason python-on-whales leaves no other way:
# following a service's log (its stream cannot be ended before the container stops;
# Fleet.follow), `docker save | docker load` between nodes (its streams split the tar at newline
# bytes and leave their pipes open; images.stream), and git, not docker: is a generated key
# ignored (secrets.unignored)?
OWN_PROCESSES = {
    ("generator/nodes/events.py", "_follow"),  # event and log streams, ended on leaving
    ("generator/nodes/events.py", "_tail"),
    ("generator/nodes/fleet.py", "follow"),
    ("generator/nodes/images.py", "stream"),
    ("generator/nodes/secrets.py", "unignored"),
}


def functions(tree: ast.AST) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]


def test_no_module_over_300_lines_and_no_function_over_40() -> None:
    too_long = []
    for path in SHIPPED:
        text = path.read_text()
        name = path.relative_to(ROOT)
        if len(text.splitlines()) > MODULE_LINES:
            too_long.append(f"{name}: {len(text.splitlines())} lines")
        for fn in functions(ast.parse(text)):
            size = (fn.end_lineno or fn.lineno) - fn.lineno + 1
            if size > FUNCTION_LINES:
                too_long.append(f"{name}:{fn.lineno} {fn.name}: {size} lines")
    assert too_long == []


def test_the_tool_runs_docker_only_through_python_on_whales() -> None:
    """Every process the tool starts itself is listed here, each with the reason."""
    found = set()
    for path in sorted(ROOT.glob("generator/**/*.py")):
        tree = ast.parse(path.read_text())
        for fn in functions(tree):
            for node in ast.walk(fn):
                called = node.func if isinstance(node, ast.Call) else None
                if (
                    isinstance(called, ast.Attribute)
                    and isinstance(called.value, ast.Name)
                    and called.value.id == "subprocess"
                    and called.attr in ("run", "Popen", "call", "check_call", "check_output")
                ):
                    found.add((str(path.relative_to(ROOT)), fn.name))
    assert found == OWN_PROCESSES


# generator/'s layers, from the bottom; docs/development.md's Layout says the same in words.
LAYERS = ["base", "config", "stack", "nodes", "operations", "cli"]


def _layer_of(module: str) -> str | None:
    """The layer a `generator...` module path names (None: the package's own `__version__`)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def test_every_module_sits_in_a_layer_and_imports_nothing_above_it() -> None:
    loose = [p.name for p in ROOT.glob("generator/*.py")]
    assert sorted(loose) == ["__init__.py", "__main__.py"]  # every other module is in a layer
    upward = []
    for path in sorted(ROOT.glob("generator/*/*.py")):
        own = LAYERS.index(path.parent.name)
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith(
                "generator"
            ):
                continue
            module = node.module or ""
            targets = [_layer_of(module)] if module != "generator" else [a.name for a in node.names]
            for target in targets:
                if target in LAYERS and LAYERS.index(target) > own:
                    upward.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {target}")
    assert upward == []


def test_only_the_node_layer_reaches_an_engine() -> None:
    """Operations and the CLI reach the nodes through `Fleet` and the node layer's modules: no
    client of their own, no reaching into `Fleet`'s clients."""
    reaching = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sorted(ROOT.glob("generator/**/*.py"))
        if "nodes" not in path.relative_to(ROOT).parts
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if ".docker[" in line or "DockerClient" in line
    ]
    assert reaching == []


def test_the_benchmarks_import_no_benchmark_that_imports_them_back() -> None:
    """Shared parts live in a module both sides import (benchmarks/common.py), never in a
    benchmark another one imports and that imports it back."""
    imports: dict[str, set[str]] = {}
    for path in ROOT.glob("benchmarks/*.py"):
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "benchmarks":
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("benchmarks."):
                found.add((node.module or "").split(".")[1])
        imports[path.stem] = found
    both = sorted((a, b) for a, found in imports.items() for b in found
                  if a in imports.get(b, set()))  # fmt: skip
    assert both == []
