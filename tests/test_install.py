"""The Python part of `make setup` (scripts/setup.sh python) from nothing, in a container of a
stock Debian 12: its python3 has neither pip nor venv and is externally managed (PEP 668), as on
a fresh Debian 12 or DGX OS (Ubuntu 24.04) machine."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from python_on_whales import DockerClient

from generator.stack import assets
from tests.support import images

pytestmark = pytest.mark.engine
ROOT = Path(assets.ROOT)
# This machine reaches the package registries through a proxy with a CA of its own; the container
# is handed the machine's bundle (a user's machine needs none of this).
CA = os.environ.get("PIP_CERT", "/etc/ssl/certs/ca-certificates.crt")
SCRIPT = """set -e
python3 -m pip --version 2>&1 | tail -1
mkdir /src && tar -x -C /src && cd /src
bash scripts/setup.sh python
.venv/bin/vllm-compose --help | head -3
.venv/bin/python -m pytest --version
cd / && python3 -c 'import generator' 2>&1 | tail -1
"""


def test_the_python_part_of_setup_installs_into_a_venv_on_a_stock_debian() -> None:
    docker = DockerClient()
    image = images.debian_base(docker)  # debootstrap's minbase with python3, as Debian ships it
    tracked = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout  # fmt: skip
    files = [f for f in tracked.decode().split("\0") if f and (ROOT / f).is_file()]
    tar = subprocess.run(
        ["tar", "-C", str(ROOT), "-c", "--null", "-T", "-"],
        input="\0".join(files).encode(), capture_output=True, check=True,
    ).stdout  # fmt: skip
    docker_cmd = [*map(str, docker.client_config.docker_cmd), "run", "--rm", "-i"]
    docker_cmd += ["-v", f"{CA}:/etc/ssl/certs/host-ca.crt:ro"]
    docker_cmd += ["-e", "PIP_CERT=/etc/ssl/certs/host-ca.crt", image, "bash", "-c", SCRIPT]
    done = subprocess.run(docker_cmd, input=tar, capture_output=True, timeout=900, check=False)
    said = done.stdout.decode(errors="replace") + done.stderr.decode(errors="replace")
    assert done.returncode == 0, said
    assert "No module named pip" in said  # the stock python3 had none, before and after
    assert "==> virtual environment .venv" in said
    assert "Usage: vllm-compose" in said and "pytest " in said
    assert "No module named 'generator'" in said  # nothing went into the system's Python
    assert "ERROR" not in said, said
