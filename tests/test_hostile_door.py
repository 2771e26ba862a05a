"""What a careless or hostile user can put in the front door's maps, its keys file and its own
files in the state folder: each is refused (exit 2, the file and field named, nothing changed)
or carried whole, asserted on the maps as HAProxy reads them."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from generator.base.errors import VllmComposeError
from generator.nodes import keys
from generator.stack import doorfiles
from tests.test_cli import CASES, run

ESC = "\x1b"


def haproxy_reads(text: str) -> dict[str, str]:
    """A map file as HAProxy reads it (map_read_entries_from_file): a line's key ends at its first
    blank, its value is the rest with leading blanks skipped; an empty line or one whose key
    starts with '#' is none."""
    found: dict[str, str] = {}
    for line in text.split("\n"):
        stripped = line.lstrip(" \t").rstrip("\r")
        if not stripped or stripped.startswith("#"):
            continue
        cut = next((i for i, ch in enumerate(stripped) if ch in " \t"), len(stripped))
        found.setdefault(stripped[:cut], stripped[cut:].lstrip(" \t"))
    return found


@pytest.fixture
def place(tmp_path: Path) -> Path:
    shutil.copy(CASES / "sample.yaml", tmp_path / "c.yaml")
    return tmp_path


def state(place: Path) -> Path:
    (place / "c.state").mkdir(mode=0o700, exist_ok=True)
    return place / "c.state"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(min_size=1, max_size=40), min_size=1, max_size=6, unique=True))
def test_any_model_names_route_each_to_its_own_port_as_haproxy_reads_the_map(
    models: list[str],
) -> None:
    routes = [doorfiles.Route(m, 8400 + i) for i, m in enumerate(models)]
    read = haproxy_reads(doorfiles.routes_map(routes))
    kept = {r.model: r for r in routes if doorfiles.read_routes(doorfiles.routes_map([r]))}
    assert read == {doorfiles.key(m): str(r.port) for m, r in kept.items()}
    printable = [m for m in models if m.isprintable() and len(m.encode()) <= 256]
    assert sorted(kept) == sorted(printable)  # a name a door may hold is never dropped
    assert doorfiles.read_routes(doorfiles.routes_map(routes)) == sorted(
        kept.values(), key=lambda r: r.model
    )


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=80), st.text(max_size=80), st.integers(-5, 70000))
def test_a_route_or_peer_from_a_nodes_labels_never_adds_a_line_of_its_own(
    model: str, host: str, port: int
) -> None:
    text = doorfiles.routes_map([doorfiles.Route(model, port, host or doorfiles.LOCAL)])
    assert text.count("\n") <= 1 and len(haproxy_reads(text)) == len(text.splitlines())
    peers = doorfiles.peers_map({host: model, "ok": "a" * 64})
    assert set(haproxy_reads(peers).values()) <= {"door:ok", f"door:{host}"}
    assert "door:ok" in haproxy_reads(peers).values()


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.dictionaries(st.text(max_size=30), st.fixed_dictionaries(
    {"sha256": st.text(max_size=70) | st.just("a" * 64), "created": st.just("2026-12-07T00:00:00+00:00")}
) | st.integers() | st.none(), max_size=4))  # fmt: skip
def test_a_keys_file_is_refused_or_read_whole_and_its_map_holds_one_line_a_key(
    place: Path, entries: dict[str, object]
) -> None:
    (state(place) / "keys.json").write_text(json.dumps(entries))
    try:
        found = keys.hashes(place / "c.yaml")
    except VllmComposeError as e:
        assert e.exit_code == 2 and "keys.json" in e.message
        return
    text = doorfiles.keys_map(found | {doorfiles.ADMIN: "0" * 64})
    read = haproxy_reads(text)
    assert sorted(read.values()) == sorted([*found, doorfiles.ADMIN])
    assert list(read.values()).count(doorfiles.ADMIN) == 1
    assert not any(name.startswith(doorfiles.PEER) for name in read.values())


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.binary(max_size=200))
def test_any_bytes_as_the_keys_file_are_read_or_refused_by_name_never_a_traceback(
    place: Path, data: bytes
) -> None:
    (state(place) / "keys.json").write_bytes(data)
    try:
        keys.read(place / "c.yaml")
    except VllmComposeError as e:
        assert e.exit_code == 2 and "keys.json" in e.message


@pytest.mark.parametrize(
    "name", ["alice\n", "door:x", "admin", "a b", "A", "x" * 20_000, f"a{ESC}[31m"]
)
def test_keys_add_refuses_a_name_the_map_cannot_hold_shown_short_and_escaped(
    place: Path, name: str
) -> None:
    said = run("keys", "add", "c.yaml", name, cwd=place)
    assert said.returncode == 2 and "is not a key name" in said.stderr
    assert len(said.stderr) < 400 and ESC not in said.stderr + said.stdout
    assert not (place / "c.state" / "keys.json").exists()


@pytest.mark.parametrize(
    "how", ["no config", "invalid config", "-o /etc", "door off", "config folder missing"]
)
def test_keys_acts_only_after_the_config_reads_with_its_door_on(place: Path, how: str) -> None:
    config, args = "c.yaml", []
    if how == "no config":
        (place / "c.yaml").unlink()
    elif how == "invalid config":
        (place / "c.yaml").write_text("name: [\n")
    elif how == "-o /etc":
        args = ["-o", "/etc"]
    elif how == "door off":
        (place / "c.yaml").write_text(
            (place / "c.yaml").read_text() + "front_door: {enabled: false}\n"
        )
    else:
        config = "missing/c.yaml"
    listing = [] if args else [["ls", config]]  # ls writes nothing: it takes no -o
    for command in [["add", config, "alice", *args], ["revoke", config, "alice", *args], *listing]:
        said = run("keys", *command, cwd=place)
        assert said.returncode == 2, (command, said.stdout, said.stderr)
        assert "Traceback" not in said.stderr and said.stdout == ""
    assert not (place / "c.state").exists()


def test_keys_ls_refuses_a_file_with_escapes_or_entries_of_the_wrong_types(place: Path) -> None:
    for entries in ({f"x{ESC}[2J": {"sha256": "a" * 64, "created": "2026-12-07"}},
                    {"bob": ["sha", 1]}, {"bob": {"sha256": "a" * 63 + "\n", "created": "x"}},
                    ["a list"], {"bob": {"sha256": "a" * 64, "created": "2026-12-07", "admin": 1}}):  # fmt: skip
        (state(place) / "keys.json").write_text(json.dumps(entries))
        said = run("keys", "ls", "c.yaml", cwd=place)
        assert said.returncode == 2 and "c.state/keys.json" in said.stderr, said.stderr
        assert ESC not in said.stdout + said.stderr and said.stdout == ""


def test_a_key_added_is_said_to_be_kept_when_the_door_cannot_be_reached(place: Path) -> None:
    said = run("keys", "add", "c.yaml", "alice", cwd=place)  # its contexts do not exist
    assert said.returncode == 1 and said.stdout.startswith("sk-")
    assert "alice's key is kept in the state folder; the next `up` brings it" in said.stderr
    assert keys.read(place / "c.yaml").keys() == {"alice"}


def _add_many(config: str, who: str) -> None:
    for i in range(10):
        keys.add(Path(config), f"{who}-{i}")


def test_keys_added_at_the_same_time_are_all_kept(place: Path) -> None:
    config = str(place / "c.yaml")
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        pool.starmap(_add_many, [(config, f"user{n}") for n in range(4)])
    assert len(keys.read(place / "c.yaml")) == 40


@pytest.mark.parametrize(
    "what", ["a folder", "a FIFO", "empty peer key", "not UTF-8", "2 GiB", "a bad keys file"]
)
def test_the_doors_files_in_the_state_folder_are_refused_before_any_secret_is_made(
    place: Path, what: str
) -> None:
    folder = state(place)
    path = folder / ("front-door-peer-key" if what == "empty peer key" else "front-door-routes")
    if what == "a folder":
        path.mkdir()
    elif what == "a FIFO":
        os.mkfifo(path)
    elif what == "empty peer key":
        path.write_text("")
    elif what == "not UTF-8":
        path.write_bytes(b"\xff\xfe routes")
    elif what == "2 GiB":
        with path.open("wb") as f:
            f.truncate(2 << 30)
    else:
        (folder / "keys.json").write_text('{"bob": {"sha256": "no", "created": "x"}}')
    for command in (["render", "c.yaml", "--dry-run"], ["render", "c.yaml"], ["secrets", "c.yaml"]):
        said = run(*command, cwd=place)
        assert said.returncode == 2, (command, said.stderr)
        assert "c.state/" in said.stderr and "Traceback" not in said.stderr
    assert not (folder / "api-key").exists() and not (folder / "ray-token").exists()
