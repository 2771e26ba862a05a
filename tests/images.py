"""Test base images, built locally (no registry is reachable): a minimal Debian with Python, and
the same plus real Ray. Built once per engine and kept; rebuilt whenever missing."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from python_on_whales import DockerClient

CACHE = Path("/var/cache/vllm-compose-test")
DEBIAN = "vllm-compose-test/debian:bookworm"
RAY = "vllm-compose-test/ray:2.58.0"
RAY_VERSION = "2.58.0"
STANDIN = "vllm-compose-test/ray-standin:2.58.0"

RAY_DOCKERFILE = f"""\
FROM {DEBIAN}
COPY site /opt/site
ENV PYTHONPATH=/opt/site
# pip --target leaves a `ray` script whose shebang is the host's Python; use the image's.
RUN printf '#!/usr/bin/python3\\nimport sys\\nfrom ray.scripts.scripts import main\\nsys.exit(main())\\n' \\
      > /usr/local/bin/ray && chmod +x /usr/local/bin/ray
"""


def _rootfs() -> Path:
    rootfs = CACHE / "rootfs-bookworm"
    if not (rootfs / "usr/bin/python3").exists():
        partial = CACHE / "rootfs-bookworm.partial"
        subprocess.run(["rm", "-rf", str(partial)], check=True)
        partial.parent.mkdir(parents=True, exist_ok=True)
        print(f"debootstrap: a minimal Debian with Python into {partial} (about a minute)")
        subprocess.run(
            [
                "debootstrap",
                "--variant=minbase",
                "--include=python3,ca-certificates,iproute2,curl,procps",
                "bookworm",
                str(partial),
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        partial.rename(rootfs)
    return rootfs


def _ray_site() -> Path:
    site = CACHE / f"ray-{RAY_VERSION}-site"
    if not (site / "ray").is_dir():
        partial = CACHE / f"ray-{RAY_VERSION}-site.partial"
        subprocess.run(["rm", "-rf", str(partial)], check=True)
        print(f"pip: ray=={RAY_VERSION} into {partial}")
        subprocess.run(
            [
                "python3",
                "-m",
                "pip",
                "install",
                "-q",
                "--no-warn-script-location",
                "--target",
                str(partial),
                f"ray=={RAY_VERSION}",
            ],
            check=True,
        )
        partial.rename(site)
    return site


def debian_base(docker: DockerClient) -> str:
    if not docker.image.exists(DEBIAN):
        docker_cmd = [*docker.client_config.docker_cmd, "import", "-", DEBIAN]
        with subprocess.Popen(
            ["tar", "-C", str(_rootfs()), "-c", "."], stdout=subprocess.PIPE
        ) as tar:
            subprocess.run(docker_cmd, stdin=tar.stdout, check=True, stdout=subprocess.DEVNULL)
    return DEBIAN


def ray_base(docker: DockerClient) -> str:
    debian_base(docker)
    if not docker.image.exists(RAY):
        with tempfile.TemporaryDirectory() as context:
            (Path(context) / "Dockerfile").write_text(RAY_DOCKERFILE)
            subprocess.run(["cp", "-a", str(_ray_site()), f"{context}/site"], check=True)
            docker.legacy_build(context, tags=[RAY])
    return RAY


def standin_base(docker: DockerClient) -> str:
    """Ray plus the STAND-IN `vllm` (tests/standin_vllm.py) for the Ray-backend deploy tests."""
    ray_base(docker)
    if not docker.image.exists(STANDIN):
        with tempfile.TemporaryDirectory() as context:
            shutil.copy(Path(__file__).parent / "standin_vllm.py", f"{context}/vllm")
            (Path(context) / "Dockerfile").write_text(
                f"FROM {RAY}\nCOPY vllm /usr/local/bin/vllm\nRUN chmod +x /usr/local/bin/vllm\n"
            )
            docker.legacy_build(context, tags=[STANDIN])
    return STANDIN
