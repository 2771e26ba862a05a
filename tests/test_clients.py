"""A node's client: Compose started as its own binary where its plugin file is found, through
`docker compose` where not; and the direct call answers as Compose does."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from generator.nodes import clients


@pytest.fixture
def plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The user's plugin folder, empty; no system folder."""
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    monkeypatch.setattr(clients, "SYSTEM_PLUGIN_DIRS", ())
    clients.compose_binary.cache_clear()
    yield tmp_path / "cli-plugins"
    clients.compose_binary.cache_clear()


def client(folder: Path, context: str = "spark1") -> list[str]:
    made = clients.client(context, [folder / "compose.yaml"], [folder / "contexts.env"], "demo")
    return [str(part) for part in made.client_config.docker_compose_cmd]


def test_compose_is_started_as_its_own_binary_with_dockers_global_flags(plugins: Path) -> None:
    plugins.mkdir()
    (plugins / "docker-compose").write_text("#!/bin/sh\n")
    (plugins / "docker-compose").chmod(0o755)
    assert client(Path("/f")) == [
        str(plugins / "docker-compose"),
        "--context",
        "spark1",
        "--file",
        "/f/compose.yaml",
        "--env-file",
        "/f/contexts.env",
        "--project-name",
        "demo",
    ]


def test_without_a_plugin_file_compose_runs_through_docker(plugins: Path) -> None:
    plugins.mkdir()
    (plugins / "docker-compose").write_text("not executable\n")
    command = client(Path("/f"))
    assert Path(command[0]).name == "docker" and command[1:4] == ["--context", "spark1", "compose"]


@pytest.mark.engine
def test_the_direct_call_reads_a_project_and_its_engine_as_docker_compose_does(
    tmp_path: Path,
) -> None:
    (tmp_path / "compose.yaml").write_text("services:\n  a:\n    image: busybox\n")
    (tmp_path / "contexts.env").write_text("")
    if clients.compose_binary() is None:
        pytest.fail("no Compose plugin file found where the docker CLI looks")
    direct = client(tmp_path, "default")
    through = ["docker", "--context", "default", "compose", *direct[3:]]
    for args in (["config", "--services"], ["ps", "--all", "--format", "json"]):
        said = [
            subprocess.run([*c, *args], capture_output=True, text=True) for c in (direct, through)
        ]
        assert said[0].returncode == 0, said[0].stderr
        assert said[0].stdout == said[1].stdout
    assert said[0].stdout == "" and direct[0] != through[0]
