"""The secret files beside a config: which are generated, how, and what is refused; the archive
that carries them onto a node."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from generator import config, secrets
from generator.errors import VllmComposeError
from tests.test_config import BASE


def test_ray_backend_gets_an_api_key_and_a_ray_token_each_0600_and_never_rewritten(
    tmp_path: Path,
) -> None:
    path = tmp_path / "c.yaml"
    found = secrets.local(path, config.parse(BASE))
    assert found.generated == {
        "api_key": tmp_path / "c.api-key",
        "ray_token": tmp_path / "c.ray-token",
    }
    for file in found.generated.values():
        assert file.stat().st_mode & 0o777 == 0o600 and len(file.read_text()) >= 32
    key = (tmp_path / "c.api-key").read_text()
    again = secrets.local(path, config.parse(BASE))
    assert again.generated == {} and again.files == found.files
    assert (tmp_path / "c.api-key").read_text() == key


def test_native_backend_needs_no_ray_token(tmp_path: Path) -> None:
    found = secrets.local(tmp_path / "c.yaml", config.parse(BASE + "backend: native\n"))
    assert set(found.files) == {"api_key"}


def test_a_named_file_that_is_missing_or_readable_by_others_is_refused(tmp_path: Path) -> None:
    named = config.parse(BASE + "secrets: {ray_token_file: token}\n")
    with pytest.raises(VllmComposeError, match=r"secrets\.ray_token_file: .*/token does not exist"):
        secrets.local(tmp_path / "c.yaml", named)
    (tmp_path / "token").write_text("t" * 40)
    (tmp_path / "token").chmod(0o644)
    with pytest.raises(VllmComposeError, match="can be read by other users"):
        secrets.local(tmp_path / "c.yaml", named)


def test_a_secret_file_may_live_anywhere_relative_to_the_config_or_absolute(
    tmp_path: Path,
) -> None:
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "api").write_text("k" * 40)
    (tmp_path / "elsewhere").write_text("t" * 40)
    for file in ("keys/api", "elsewhere"):
        (tmp_path / file).chmod(0o600)
    named = config.parse(
        BASE + f"secrets: {{api_key_file: ./keys/api, ray_token_file: {tmp_path}/elsewhere}}\n"
    )
    found = secrets.local(tmp_path / "c.yaml", named)
    assert found.files == {"api_key": tmp_path / "keys/api", "ray_token": tmp_path / "elsewhere"}
    assert found.generated == {}


def test_an_empty_api_key_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "c.api-key").write_text(" \n")
    (tmp_path / "c.api-key").chmod(0o600)
    with pytest.raises(VllmComposeError) as refused:
        secrets.local(tmp_path / "c.yaml", config.parse(BASE))
    assert refused.value.message == (
        f"secrets.api_key_file: {tmp_path}/c.api-key is empty: serving would take requests from"
        " anyone"
    )


def test_generated_files_git_would_commit_are_added_to_the_gitignore_beside_them(
    tmp_path: Path,
) -> None:
    import subprocess

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    found = secrets.local(tmp_path / "c.yaml", config.parse(BASE))
    generated = sorted(found.generated.values())
    assert secrets.unignored(generated) == generated
    assert secrets.ignore(generated) == tmp_path / ".gitignore"
    assert (tmp_path / ".gitignore").read_text() == "c.api-key\nc.ray-token\n"
    assert secrets.unignored(generated) == []


def test_the_archive_a_node_reads_its_secrets_from_holds_each_file_0600_owned_by_root() -> None:
    archive = secrets._archive({".api-key.1f": b"key\n", ".ray-token.2e": b"token"})
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        entries = {m.name: (m.mode, m.uid, m.gid, tar.extractfile(m).read()) for m in tar}  # type: ignore[union-attr]
    assert entries == {
        ".api-key.1f": (0o600, 0, 0, b"key\n"),
        ".ray-token.2e": (0o600, 0, 0, b"token"),
    }
