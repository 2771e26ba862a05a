"""One state folder per config (CONFIG-STEM.state/): what an earlier version kept beside the
config is moved there on the next command, said in one line, nothing lost or overwritten; the
folder itself is never written through a link."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from generator.base.errors import UnsafePath
from generator.nodes import keys
from tests.test_cli import CASES, run


@pytest.fixture
def old(tmp_path: Path) -> Path:
    """A config with an earlier version's side files beside it."""
    shutil.copy(CASES / "sample.yaml", tmp_path / "c.yaml")
    for name in ("c.api-key", "c.ray-token", "c.keys.json"):
        (tmp_path / name).write_text(f"{name}-0123456789\n" if name != "c.keys.json" else "{}\n")
        (tmp_path / name).chmod(0o600)
    (tmp_path / "c.history" / "20261201T000000.000000Z").mkdir(parents=True)
    (tmp_path / "c.history" / "20261201T000000.000000Z" / "config.yaml").write_text("x\n")
    (tmp_path / "c.lock.json").write_text("{}\n")  # committed: stays
    return tmp_path


def test_an_earlier_versions_side_files_move_into_the_state_folder_in_one_line(old: Path) -> None:
    said = run("validate", "c.yaml", cwd=old)
    assert said.returncode == 0, said.stderr
    moved = [line for line in said.stderr.splitlines() if "moved" in line]
    assert moved == [
        "moved 4 side file(s) into c.state/: c.api-key, c.ray-token, c.keys.json, c.history"
    ]
    state = old / "c.state"
    assert state.stat().st_mode & 0o777 == 0o700
    assert (state / "api-key").read_text() == "c.api-key-0123456789\n"
    assert (state / "api-key").stat().st_mode & 0o777 == 0o600  # a rename: never copied
    assert (state / "history" / "20261201T000000.000000Z" / "config.yaml").read_text() == "x\n"
    assert sorted(p.name for p in old.iterdir()) == ["c.lock.json", "c.state", "c.yaml"]
    again = run("validate", "c.yaml", cwd=old)
    assert "moved" not in again.stderr  # said once


def test_a_file_the_config_names_a_link_or_a_name_taken_in_the_state_folder_is_left(
    old: Path,
) -> None:
    config = old / "c.yaml"
    config.write_text(config.read_text() + "secrets: {api_key_file: c.api-key}\n")
    (old / "c.ray-token").unlink()
    (old / "c.ray-token").symlink_to(old / "c.lock.json")
    (old / "c.state").mkdir(mode=0o700)
    (old / "c.state" / "keys.json").write_text('{"kept": 1}\n')
    said = run("validate", "c.yaml", cwd=old)
    assert said.returncode == 0, said.stderr
    assert "moved 1 side file(s) into c.state/: c.history" in said.stderr
    assert "left beside c.yaml: c.ray-token (not a file or folder of its own)" in said.stderr
    assert "left beside c.yaml: c.keys.json (c.state/keys.json is there already)" in (said.stderr)
    assert (old / "c.api-key").read_text() == "c.api-key-0123456789\n"  # the config's own
    assert (old / "c.state" / "keys.json").read_text() == '{"kept": 1}\n'  # not overwritten
    assert (old / "c.keys.json").read_text() == "{}\n"  # nor lost


def test_an_invalid_config_moves_nothing(old: Path) -> None:
    (old / "c.yaml").write_text("name: [\n")
    assert run("validate", "c.yaml", cwd=old).returncode == 2
    assert not (old / "c.state").exists()
    assert (old / "c.api-key").exists()


def test_a_state_folder_that_is_a_link_is_refused_and_nothing_goes_through_it(
    tmp_path: Path,
) -> None:
    shutil.copy(CASES / "sample.yaml", tmp_path / "c.yaml")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "c.state").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UnsafePath, match="is a link"):
        keys.add(tmp_path / "c.yaml", "alice")
    said = run("secrets", "c.yaml", cwd=tmp_path)
    assert said.returncode == 2
    assert "c.state is a link" in said.stderr
    assert list((tmp_path / "elsewhere").iterdir()) == []
