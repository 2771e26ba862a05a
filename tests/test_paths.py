"""Paths a careless or hostile user hands the tool: links inside the output folder, system
folders as the output folder. Each is refused (exit 2, naming it) before anything is written:
no secret generated, nothing written, chmodded or shown through a link."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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


def decoys_untouched(place: Path) -> None:
    assert sorted(p.name for p in (place / "decoy").iterdir()) == ["mine"]
    assert (place / "decoy").stat().st_mode & 0o777 == 0o755
    assert (place / "decoy-secret").read_text() == DECOY_SECRET


def untouched(place: Path) -> None:
    decoys_untouched(place)
    assert not (place / "c.state" / "api-key").exists()  # nothing generated before the refusal


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


# Side files beside the config: the lock, history, stamps, logs and bench results.


def test_a_lock_that_is_a_link_is_refused_and_its_target_never_shown(place: Path) -> None:
    (place / "c.lock.json").symlink_to(place / "decoy-secret")
    said = run("render", "c.yaml", "--dry-run", cwd=place)
    assert said.returncode == 2 and "c.lock.json is a link" in said.stderr, said.stderr
    assert DECOY_SECRET not in said.stdout + said.stderr
    untouched(place)


def test_a_history_entry_that_is_a_link_is_never_read(place: Path) -> None:
    from generator.base.errors import UnsafePath
    from generator.operations import history

    config = place / "c.yaml"
    entry = history.record(config, config.read_text(), None)
    (entry.folder / history.CONFIG).unlink()
    (entry.folder / history.CONFIG).symlink_to(place / "decoy-secret")
    with pytest.raises(UnsafePath, match="is a link") as refused:
        history.entries(config)[-1].config_text  # noqa: B018
    assert DECOY_SECRET not in str(refused.value)
    linked = history.folder_for(config) / "29990101T000000.000000Z"
    linked.symlink_to(place / "decoy")
    assert [e.folder for e in history.entries(config)] == [entry.folder]  # a linked entry: none


@pytest.mark.parametrize("side", ["history", "logs", "bench", "stamps"])
def test_nothing_is_written_through_a_side_folder_or_file_that_is_a_link(
    place: Path, side: str
) -> None:
    from generator.base.errors import UnsafePath
    from generator.operations import bench, benchruns, evidence, history, stamps

    config = place / "c.yaml"
    sweep = bench.Sweep([1], 1, 1, 1)
    write: dict[str, tuple[Path, Callable[[], object]]] = {
        "history": (history.folder_for(config), lambda: history.record(config, "x", None)),
        "logs": (place / "c.state/logs", lambda: evidence.last_start(place / "c.state/logs", {})),
        "bench": (place / "c.state/bench", lambda: benchruns.save(config, None, sweep, [])),
        "stamps": (stamps.path_for(config), lambda: stamps.record(config, "/m", {})),
    }
    where, act = write[side]
    where.parent.mkdir(exist_ok=True)
    where.symlink_to(place / ("decoy-secret" if side == "stamps" else "decoy"))
    with pytest.raises(UnsafePath, match="is a link"):
        act()
    decoys_untouched(place)


def test_a_config_that_is_not_a_regular_small_utf8_file_is_refused_without_reading_it(
    place: Path,
) -> None:
    import os

    os.mkfifo(place / "fifo.yaml")  # a read would hang
    (place / "big.yaml").write_text("#" * (2 << 20))
    (place / "latin.yaml").write_bytes(b"name: caf\xe9\n")
    for name, why in [("fifo.yaml", "is not a regular file"), ("big.yaml", "is over 1 MiB"),
                      ("latin.yaml", "is not UTF-8 text")]:  # fmt: skip
        said = run("validate", name, cwd=place)
        assert said.returncode == 2 and why in said.stderr, said.stderr
    (place / "linked.yaml").symlink_to(place / "c.yaml")  # the user's own link: followed
    assert run("validate", "linked.yaml", cwd=place).returncode == 0


def test_a_model_mount_covers_the_model_and_nothing_above_it() -> None:
    from generator.config.mounts import model_mount

    snapshot = "/models/hub/models--Qwen--Qwen3/snapshots/0a1b2c"
    assert model_mount(snapshot) == "/models/hub/models--Qwen--Qwen3"  # where its links point
    assert model_mount("/snapshots/main") == "/snapshots/main"  # not a cache: never two up
    assert model_mount("/var/snapshots/main") == "/var/snapshots/main"
    assert model_mount("//models/x/") == "/models/x"
    assert model_mount("/models/a/../b") == "/models/b"


def test_upgrade_to_an_invalid_config_is_refused_before_anything_is_rendered_or_asked(
    place: Path,
) -> None:
    from generator.operations import history

    config = place / "c.yaml"
    history.record(config, config.read_text(), None)  # a stack served from it once
    config.write_text(config.read_text().replace("name: qwen35", "name: Bad Name"))
    before = sorted(str(p.relative_to(place)) for p in place.rglob("*"))
    said = run("upgrade", "c.yaml", cwd=place)
    assert said.returncode == 2, said.stderr
    assert said.stderr.splitlines()[0] == "c.yaml is invalid:", said.stderr
    assert sorted(str(p.relative_to(place)) for p in place.rglob("*")) == before


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    placed=st.lists(st.sampled_from(sorted(LINKS)), min_size=1, max_size=4, unique=True),
    dry_run=st.booleans(),
)
def test_any_set_of_links_in_the_output_folder_is_refused_and_nothing_goes_through(
    tmp_path_factory: pytest.TempPathFactory, placed: list[str], dry_run: bool
) -> None:
    """In process: `render` over an output folder with links at any of the places the tool
    writes (a node folder, secrets/, compose.yaml, a secret) refuses, and the decoys stay."""
    import contextlib
    import io
    from unittest import mock

    from generator import cli as commands

    place = tmp_path_factory.mktemp("links")
    shutil.copy(CASES / "sample.yaml", place / "c.yaml")
    (place / "decoy").mkdir(mode=0o755)
    (place / "decoy" / "mine").write_text("mine\n")
    (place / "decoy-secret").write_text(DECOY_SECRET)
    (place / "decoy-secret").chmod(0o600)
    for rel, target in sorted((LINKS[where] for where in placed), key=lambda x: x[0].count("/")):
        link = place / "out" / rel
        if not any(p.is_symlink() for p in link.parents):  # not below a link placed already
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(place / target)
    said = io.StringIO()
    argv = ["vllm-compose", "render", str(place / "c.yaml"), "-o", str(place / "out")]
    with (
        contextlib.redirect_stdout(said),
        contextlib.redirect_stderr(said),
        mock.patch.object(sys, "argv", argv + (["--dry-run"] if dry_run else [])),
        pytest.raises(SystemExit) as exited,
    ):
        commands.main()
    assert exited.value.code == 2 and "is a link" in said.getvalue(), said.getvalue()
    assert DECOY_SECRET not in said.getvalue()
    untouched(place)


def test_a_config_in_a_linked_folder_keeps_its_lock_and_stamps_beside_it(tmp_path: Path) -> None:
    """The config's own folder may be a link the user made: the side files are written there."""
    from generator.operations import stamps

    (tmp_path / "real").mkdir()
    (tmp_path / "linked").symlink_to(tmp_path / "real")
    config = tmp_path / "linked" / "c.yaml"
    shutil.copy(CASES / "sample.yaml", config)
    stamps.record(config, "/m", {})
    assert (tmp_path / "real" / "c.state" / "model-stamps.json").is_file()


@pytest.mark.parametrize("command", ["render", "lock", "secrets", "up", "upgrade", "watch"])
def test_every_command_that_writes_node_folders_refuses_links_before_anything_else(
    place: Path, command: str
) -> None:
    """An output folder full of links to the decoys: each command refuses it (exit 2, naming a
    link) before a secret is generated or an engine is asked (the config's contexts do not
    exist: a command that went on would fail on them instead)."""
    from generator.operations import history

    history.record(place / "c.yaml", (place / "c.yaml").read_text(), None)  # for upgrade
    for rel, target in LINKS.values():
        link = place / "out" / rel
        if not any(p.is_symlink() for p in link.parents):
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(place / target)
    said = run(command, "c.yaml", "-o", "out", cwd=place)
    assert said.returncode == 2, said.stdout + said.stderr
    assert "is a link; vllm-compose writes, shows and chmods nothing through one" in said.stderr
    assert DECOY_SECRET not in said.stdout + said.stderr
    untouched(place)


SIDE_LINKS = {  # beside c.yaml and in its state folder: each side file or folder a link to a decoy
    "c.lock.json": "decoy-secret",
    "c.state/history": "decoy",
    "c.state/logs": "decoy",
    "c.state/bench": "decoy",
    "c.state/model-stamps.json": "decoy-secret",
    "c.state/keys.json": "decoy-secret",
}


@pytest.mark.parametrize(
    "command", ["render", "lock", "secrets", "up", "upgrade", "rollback", "bench", "diagnose",
                "verify-model", "preflight"],
)  # fmt: skip
@pytest.mark.parametrize("lock_linked", [True, False], ids=["lock-linked", "lock-absent"])
def test_no_command_reads_writes_or_shows_a_side_file_through_a_link(
    place: Path, command: str, lock_linked: bool
) -> None:
    """Every side file beside the config a link to a decoy (with and without the lock among
    them, which most commands read first): whatever the command then does (the config's contexts
    do not exist), the decoys are untouched and never printed. (watch is left out here: with no
    engine it keeps trying to recover; the output-folder walk above covers it.)"""
    (place / "c.state").mkdir(mode=0o700)
    for name, target in SIDE_LINKS.items():
        if lock_linked or name != "c.lock.json":
            (place / name).symlink_to(place / target)
    said = run(command, "c.yaml", cwd=place)
    assert DECOY_SECRET not in said.stdout + said.stderr
    decoys_untouched(place)


def test_every_side_file_of_a_config_is_named_in_one_place() -> None:
    from generator.base.sidefiles import Beside
    from generator.nodes import secrets
    from generator.operations import gate, history, lock, stamps

    config = Path("/srv/c.yaml")
    beside = Beside(config)
    assert [lock.path_for(config), history.folder_for(config), stamps.path_for(config)] == [
        beside.lock,
        beside.history,
        beside.stamps,
    ]
    assert gate.path_for(config) == beside.answers == Path("/srv/c.answers.json")
    assert [beside.lock, beside.logs, beside.bench] == [
        Path("/srv/c.lock.json"),  # committed with the config
        Path("/srv/c.state/logs"),  # state: in one folder beside it
        Path("/srv/c.state/bench"),
    ]
    assert secrets._default(config, "api_key") == Path("/srv/c.state/api-key")
