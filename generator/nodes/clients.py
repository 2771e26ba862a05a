"""A node's python-on-whales client, with Compose run as its own program.

`docker compose ...` is the `docker` CLI, which starts the Compose plugin once to read its
metadata and again to run it, and stays beside it until it ends: three program starts per call,
two resident (23 + 51 MiB). Compose's binary takes the `docker` CLI's global flags itself when
started on its own (`docker-compose --context X --file ... up`), so the client starts it directly
where it is installed as a plugin: one program per call (0.1 s against 0.2-0.35 s for a
`compose ps` here), and on 8 nodes at once 8 fewer processes. Where no plugin file is found,
Compose runs through `docker` as usual."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

from python_on_whales import DockerClient
from python_on_whales.client_config import ClientConfig, Command

# Where the docker CLI looks for its plugins, after the user's own folder (docker/cli's
# cli-plugins/manager: defaultSystemPluginDirs on Linux).
SYSTEM_PLUGIN_DIRS = (
    "/usr/local/lib/docker/cli-plugins",
    "/usr/local/libexec/docker/cli-plugins",
    "/usr/lib/docker/cli-plugins",
    "/usr/libexec/docker/cli-plugins",
)


@functools.cache
def compose_binary() -> str | None:
    """The Compose plugin's file, as the docker CLI would find it; None when there is none."""
    config = Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker")
    for folder in (config / "cli-plugins", *map(Path, SYSTEM_PLUGIN_DIRS)):
        found = folder / "docker-compose"
        if found.is_file() and os.access(found, os.X_OK):
            return str(found)
    return None


@dataclass
class _Config(ClientConfig):
    """python-on-whales's config, its Compose command started as Compose's own binary."""

    compose: str = ""

    @property
    def docker_compose_cmd(self) -> Command:
        through_docker = super().docker_compose_cmd  # docker <global flags> compose <its flags>
        own = len(self.docker_cmd)
        return Command([self.compose, *through_docker[1:own], *through_docker[own + 1 :]])


def client(context: str, files: list[Path], env_files: list[Path], project: str) -> DockerClient:
    """The engine behind `context`, and Compose's project `project` from `files`."""
    binary = compose_binary()
    settings = ClientConfig if binary is None else functools.partial(_Config, compose=binary)
    return DockerClient(
        client_config=settings(
            context=context,
            compose_files=list(files),
            compose_env_files=list(env_files),
            compose_project_name=project,
        )
    )
