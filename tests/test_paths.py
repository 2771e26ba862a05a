"""Paths a careless or hostile user hands the tool: links inside the output folder, system
folders as the output folder. Each is refused (exit 2, naming it) before anything is written:
no secret generated, nothing written, chmodded or shown through a link."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.test_cli import CASES, run

DECOY_SECRET = "decoy-secret-never-shown-0123456789"


@pytest.fixture
def place(tmp_path: Path) -> Path:
    """A config, a decoy folder (mode 0755, one file) and a decoy secret file beside it."""
    shutil.copy(CASES / "sample.yaml", tmp_path / "c.yaml")
    (tmp_path / "decoy").mkdir(mode=0o755)
    (tmp_path / "decoy" / "mine").write_text("mine\n")
    (tmp_path / "decoy-secret").write_text(DECOY_SECRET)
    (tmp_path / "decoy-secret").chmod(0o600)
    return tmp_path


def untouched(place: Path) -> None:
    assert sorted(p.name for p in (place / "decoy").iterdir()) == ["mine"]
    assert (place / "decoy").stat().st_mode & 0o777 == 0o755
    assert (place / "decoy-secret").read_text() == DECOY_SECRET
    assert not (place / "c.api-key").exists()  # nothing generated before the refusal


LINKS = {
    "node folder": ("spark-1", "decoy"),
    "secrets folder": ("spark-1/secrets", "decoy"),
    "compose file": ("spark-1/compose.yaml", "decoy-secret"),
    "secret file": ("spark-2/secrets/api_key", "decoy-secret"),
}


@pytest.mark.parametrize("where", LINKS, ids=list(LINKS))
@pytest.mark.parametrize("dry_run", [False, True], ids=["render", "dry-run"])
def test_a_link_inside_the_output_folder_is_refused_and_nothing_goes_through_it(
    place: Path, where: str, dry_run: bool
) -> None:
    rel, target = LINKS[where]
    link = place / "out" / rel
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(place / target)
    said = run("render", "c.yaml", "-o", "out", *(["--dry-run"] if dry_run else []), cwd=place)
    assert said.returncode == 2, said.stdout + said.stderr
    assert f"out/{rel} is a link" in said.stderr, said.stderr
    assert DECOY_SECRET not in said.stdout + said.stderr
    untouched(place)


@pytest.mark.parametrize("folder", ["/", "/etc", "/usr/local", "/var/lib/docker/x", "c.yaml"])
def test_a_system_folder_or_a_file_as_the_output_folder_is_refused_first(
    place: Path, folder: str
) -> None:
    for dry_run in ([], ["--dry-run"]):
        said = run("render", "c.yaml", "-o", folder, *dry_run, cwd=place)
        assert said.returncode == 2, said.stderr
        assert said.stderr.startswith(f"-o {folder}"), said.stderr
        untouched(place)
    assert (place / "c.yaml").read_text() == (CASES / "sample.yaml").read_text()


def test_a_link_to_a_system_folder_as_the_output_folder_is_refused(place: Path) -> None:
    (place / "out").symlink_to("/etc")
    said = run("render", "c.yaml", "-o", "out", cwd=place)
    assert said.returncode == 2 and "/etc is a system folder" in said.stderr, said.stderr
    untouched(place)
