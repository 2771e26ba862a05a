"""The README cannot drift: every `vllm-compose` command in its console blocks runs here, for real
where it needs no node (validate, render, keys ls, schema) against the quickstart's own config,
and as `--help` where it does, with every option it uses known to that command; its output where
the README shows one is what the command prints. And its shape: short, the quickstart early,
every docs page it links there and under 300 lines."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests.test_cli import run

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()
RUNNABLE = {"validate", "render", "schema", "version", "keys ls"}  # need no node


def commands() -> list[tuple[list[str], list[str]]]:
    """Each `$ vllm-compose ...` of a console block, as argv, with the lines shown under it."""
    found: list[tuple[list[str], list[str]]] = []
    for block in re.findall(r"```console\n(.*?)```", README, re.S):
        for line in block.splitlines():
            if line.startswith("$ "):
                words = shlex.split(line[2:], comments=True)
                found.append((words[1:], []) if words[:1] == ["vllm-compose"] else ([], []))
            elif found and found[-1][0]:
                found[-1][1].append(line)
    return [(argv, shown) for argv, shown in found if argv]


def test_the_readme_is_short_and_its_quickstart_comes_early() -> None:
    lines = README.splitlines()
    assert len(lines) <= 250
    assert any(line.startswith("## Quickstart") for line in lines[:60])
    for page in re.findall(r"\]\((docs/[\w-]+\.md)", README):
        assert (ROOT / page).is_file(), page
    for page in (ROOT / "docs").glob("*.md"):
        assert len(page.read_text().splitlines()) <= 300, page.name


def test_every_link_to_a_section_names_a_heading_that_is_there() -> None:
    for page, anchor in re.findall(r"\]\(((?:docs/)?[\w-]+\.md)#([\w-]+)\)", README):
        headings = re.findall(r"^#+ (.+)$", (ROOT / page).read_text(), re.M)
        slugs = {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}
        assert anchor in slugs, f"{page}#{anchor}"


@pytest.mark.parametrize("argv,shown", commands(), ids=[" ".join(a) for a, _ in commands()])
def test_every_readme_command_runs_as_written(
    tmp_path: Path, argv: list[str], shown: list[str]
) -> None:
    config = re.search(r"`cluster.yaml`:\n```yaml\n(.*?)```", README, re.S)
    assert config is not None
    (tmp_path / "cluster.yaml").write_text(config[1])
    if argv[0] in RUNNABLE or " ".join(argv[:2]) in RUNNABLE:
        said = run(*argv, cwd=tmp_path)
        assert said.returncode == 0, said.stdout + said.stderr
        assert [line.rstrip() for line in shown] == said.stdout.splitlines()[: len(shown)]
        return
    words = [w for w in argv if not w.startswith("-") and w != "cluster.yaml"]
    helped = run(*words[: 2 if words[0] == "keys" else 1], "--help", cwd=tmp_path)
    assert helped.returncode == 0, helped.stderr
    for option in (w.split("=")[0] for w in argv if w.startswith("--")):
        assert re.search(rf"{re.escape(option)}(?![\w-])", helped.stdout), f"no {option}"
