"""The front door's keys beside the config: hashes only, mode 0600, names checked (our logic)."""

from __future__ import annotations

import hashlib
import stat
from pathlib import Path

import pytest

from generator.base.errors import OptionError
from generator.config import load
from generator.nodes import keys, secrets
from generator.stack import doorfiles


def test_a_key_is_shown_once_and_kept_only_as_its_hash(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    key = keys.add(config, "alice")
    kept = keys.path_for(config)
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert key not in kept.read_text()
    assert keys.hashes(config) == {"alice": hashlib.sha256(key.encode()).hexdigest()}
    with pytest.raises(OptionError, match="there is a key of that name"):
        keys.add(config, "alice")
    with pytest.raises(OptionError, match="not a key name"):
        keys.add(config, "admin")
    keys.revoke(config, "alice")
    assert keys.read(config) == {}
    with pytest.raises(OptionError, match="no key of that name"):
        keys.revoke(config, "alice")


def test_the_front_doors_map_holds_the_admin_key_and_each_users_by_hash(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        "name: c\nimage: img:1\naccelerator: none\ninterface: eth1\n"
        "nodes: [{name: a, ip: 10.0.0.1, context: a}]\n"
        "model: {path: /models/m}\n"
    )
    key = keys.add(config, "bob")
    found = secrets.local(config, load(config))
    text = found.files["front_door_keys"].read_text()
    admin = (tmp_path / "c.state" / "api-key").read_text()
    assert text == doorfiles.keys_map(
        {"admin": hashlib.sha256(admin.encode()).hexdigest(), "bob": keys.hashes(config)["bob"]}
    )
    assert key not in text and admin not in text


def test_keys_ls_says_when_there_are_none_and_heads_its_columns(tmp_path: Path) -> None:
    import shutil

    from tests.test_cli import CASES, run

    shutil.copy(CASES / "sample.yaml", tmp_path / "c.yaml")
    none = run("keys", "ls", "c.yaml", cwd=tmp_path)
    assert none.returncode == 0
    assert (
        none.stdout == "no keys (only the admin key); add one: vllm-compose keys add c.yaml NAME\n"
    )
    keys.add(tmp_path / "c.yaml", "alice")
    listed = run("keys", "ls", "c.yaml", cwd=tmp_path).stdout.splitlines()
    assert listed[0] == "NAME   MADE (UTC)" and listed[1].startswith("alice  20")
