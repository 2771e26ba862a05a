"""The secret files beside a config: which are generated, how, and what is refused; the archive
that carries them onto a node."""

from __future__ import annotations

import hashlib
import io
import re
import tarfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from generator import config
from generator.base.errors import SecretFileError, VllmComposeError
from generator.nodes import secrets
from generator.stack import doorfiles
from tests.test_config import BASE


def test_ray_backend_gets_an_api_key_and_a_ray_token_each_0600_and_never_rewritten(
    tmp_path: Path,
) -> None:
    path = tmp_path / "c.yaml"
    found = secrets.local(path, config.parse(BASE))
    assert found.generated == {
        "api_key": tmp_path / "c.state" / "api-key",
        "ray_token": tmp_path / "c.state" / "ray-token",
    }
    for file in found.generated.values():
        assert file.stat().st_mode & 0o777 == 0o600 and len(file.read_text()) >= 32
    key = (tmp_path / "c.state" / "api-key").read_text()
    again = secrets.local(path, config.parse(BASE))
    assert again.generated == {} and again.files == found.files
    assert (tmp_path / "c.state" / "api-key").read_text() == key


def test_native_backend_needs_no_ray_token(tmp_path: Path) -> None:
    found = secrets.local(tmp_path / "c.yaml", config.parse(BASE + "backend: native\n"))
    assert set(found.files) == {
        "api_key", "front_door_keys", "front_door_routes", "front_door_models",
        "front_door_peer_key", "front_door_peers",
    }  # fmt: skip


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
    assert found.files == {
        "api_key": tmp_path / "keys/api",
        "ray_token": tmp_path / "elsewhere",
        "front_door_keys": tmp_path / "c.state" / "front-door-keys",  # made from the API key
        "front_door_routes": tmp_path
        / "c.state"
        / "front-door-routes",  # its own model's, to begin
        "front_door_models": tmp_path / "c.state" / "front-door-models.json",
        "front_door_peer_key": tmp_path
        / "c.state"
        / "front-door-peer-key",  # made from the API key too
        "front_door_peers": tmp_path / "c.state" / "front-door-peers",  # its own door's, to begin
    }
    assert (
        tmp_path / "c.state" / "front-door-routes"
    ).read_text() == b"/models/m".hex() + " 8400\n"
    # Its key at the other doors shows nothing of the API key; they hold its hash alone.
    door_key = doorfiles.peer_key(b"k" * 40)
    assert (tmp_path / "c.state" / "front-door-peer-key").read_text() == f"door {door_key}\n"
    assert "k" * 40 not in door_key and len(door_key) == 64
    own = (tmp_path / "c.state" / "front-door-peers").read_text()
    assert own == f"{hashlib.sha256(door_key.encode()).hexdigest()} door:c\n"
    assert doorfiles.read_peers(own + "a line of another shape\n") == {"c": own.split()[0]}
    assert found.generated == {}


def test_an_empty_api_key_file_is_refused(tmp_path: Path) -> None:
    key_file(tmp_path, b"\n")
    with pytest.raises(VllmComposeError) as refused:
        secrets.local(tmp_path / "c.yaml", config.parse(BASE))
    assert refused.value.message == (
        f"secrets.api_key_file: {tmp_path}/c.state/api-key is empty: serving would take requests from"
        " anyone"
    )


def test_generated_secrets_land_in_a_state_folder_of_mode_0700_that_git_ignores(
    tmp_path: Path,
) -> None:
    import subprocess

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    found = secrets.local(tmp_path / "c.yaml", config.parse(BASE))
    generated = sorted(found.generated.values())
    assert [p.relative_to(tmp_path) for p in generated] == [Path("c.state/api-key"),
                                                            Path("c.state/ray-token")]  # fmt: skip
    assert (tmp_path / "c.state").stat().st_mode & 0o777 == 0o700
    assert secrets.unignored(generated) == []  # the state folder's own .gitignore
    assert not (tmp_path / ".gitignore").exists()
    named = tmp_path / "named.key"  # a file the config names is the user's: git is asked
    named.write_text("k")
    assert secrets.unignored([named]) == [named]


def test_the_archive_a_node_reads_its_secrets_from_holds_each_file_0600_owned_by_root() -> None:
    archive = secrets._archive({".api-key.1f": b"key\n", ".ray-token.2e": b"token"})
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        entries = {m.name: (m.mode, m.uid, m.gid, tar.extractfile(m).read()) for m in tar}  # type: ignore[union-attr]
    assert entries == {
        ".api-key.1f": (0o600, 0, 0, b"key\n"),
        ".ray-token.2e": (0o600, 0, 0, b"token"),
    }


def key_file(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "c.state" / "api-key"
    path.parent.mkdir(exist_ok=True)
    path.unlink(missing_ok=True)
    path.write_bytes(data)
    path.chmod(0o600)
    return path


def assert_not_shown(data: bytes, said: str) -> None:
    """The file's contents are never in the error (long enough to tell from the message's own
    words)."""
    contents = data.decode("latin-1").strip()
    assert len(contents) < 6 or contents[:40] not in said, said


@pytest.mark.parametrize(
    "data",
    [b"key\r\n", b" key", b"key ", b"k\x00ey", b"line1\nline2", "k\u00e9y".encode(),
     b"\xff\xfe", b"k" * 5000, b"key\n\n", b"\t"],
    ids=["crlf", "leading-space", "trailing-space", "nul", "two-lines", "non-ascii",
         "not-utf8", "5000-bytes", "blank-second-line", "tab"],
)  # fmt: skip
def test_a_secret_is_one_line_of_printable_ascii_or_refused_with_exit_2(
    tmp_path: Path, data: bytes
) -> None:
    key_file(tmp_path, data)
    with pytest.raises(SecretFileError) as refused:
        secrets.local(tmp_path / "c.yaml", config.parse(BASE + "backend: native\n"))
    assert refused.value.exit_code == 2
    said = "\n".join(refused.value.lines())
    assert "secrets.api_key_file: " in said
    assert_not_shown(data, said)


def test_a_final_newline_is_allowed(tmp_path: Path) -> None:
    for data in (b"k" * 40, b"k" * 40 + b"\n", b"a key with inner spaces"):
        key_file(tmp_path, data)
        found = secrets.local(tmp_path / "c.yaml", config.parse(BASE + "backend: native\n"))
        assert found.files["api_key"] == tmp_path / "c.state" / "api-key"


def test_system_files_fifos_devices_and_folders_are_refused_before_any_read(
    tmp_path: Path,
) -> None:
    import os

    os.mkfifo(tmp_path / "fifo", 0o600)  # a read would hang
    (tmp_path / "folder").mkdir(mode=0o700)
    (tmp_path / "environ").symlink_to("/proc/self/environ")
    cases = {
        "/proc/self/environ": "is under /proc",
        "environ": "is under /proc",  # through a link
        "/dev/zero": "is under /dev",
        "/sys/kernel/notes": "is under /sys",
        "fifo": "is not a regular file",
        "folder": "is not a regular file",
    }
    for file, why in cases.items():
        named = config.parse(BASE + f"backend: native\nsecrets: {{api_key_file: '{file}'}}\n")
        with pytest.raises(SecretFileError, match=why) as refused:
            secrets.local(tmp_path / "c.yaml", named)
        assert refused.value.exit_code == 2


def test_one_file_for_two_secrets_is_refused(tmp_path: Path) -> None:
    key_file(tmp_path, b"k" * 40)
    both = config.parse(
        BASE + "secrets: {api_key_file: c.state/api-key, ray_token_file: c.state/api-key}\n"
    )
    with pytest.raises(SecretFileError, match=r"is also secrets\.api_key_file"):
        secrets.local(tmp_path / "c.yaml", both)


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.binary(max_size=64))
def test_any_bytes_are_accepted_exactly_when_they_are_one_printable_line(
    tmp_path: Path, data: bytes
) -> None:
    key_file(tmp_path, data)
    line = data[:-1] if data.endswith(b"\n") else data
    wanted = bool(re.fullmatch(rb"[\x21-\x7e]([\x20-\x7e]*[\x21-\x7e])?", line))
    try:
        secrets.local(tmp_path / "c.yaml", config.parse(BASE + "backend: native\n"))
        accepted = True
    except SecretFileError as e:
        accepted = False
        assert_not_shown(data, "\n".join(e.lines()))
    assert accepted == wanted, data
