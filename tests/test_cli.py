from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

CASES = Path(__file__).parent / "cases"


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "generator", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
    )


def test_validate_lists_nodes_and_roles() -> None:
    result = run("validate", str(CASES / "sample.yaml"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[1:] == [
        "  spark-1: head, 192.168.200.12 on enp1s0f1np1, context spark-1",
        "  spark-2: worker, 192.168.200.13 on enp1s0f1np1, context spark-2",
    ]


def test_render_reports_create_then_identical_then_overwrite(tmp_path: Path) -> None:
    config = tmp_path / "cluster.yaml"
    config.write_text((CASES / "sample.yaml").read_text())
    first = run("render", str(config), cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "   create  compose/qwen35/spark-1/compose.yaml" in first.stdout.splitlines()
    assert (tmp_path / "compose/qwen35/spark-2/compose.yaml").is_file()

    second = run("render", str(config), cwd=tmp_path)
    assert {line.split()[0] for line in second.stdout.splitlines()} == {"identical"}

    config.write_text(config.read_text().replace("port: 30000", "port: 30001"))
    third = run("render", str(config), cwd=tmp_path)
    assert "overwrite  compose/qwen35/spark-1/compose.yaml" in third.stdout
    assert "identical  compose/qwen35/spark-1/Dockerfile" in third.stdout


def case(name: str, folder: Path) -> Path:
    """A copy of a case config in the test's own folder: render writes the secret files beside
    the config, never into the source tree."""
    copy = folder / name
    copy.write_text((CASES / name).read_text())
    return copy


def test_dry_run_shows_a_diff_and_writes_nothing(tmp_path: Path) -> None:
    run("render", str(case("sample.yaml", tmp_path)), "-o", str(tmp_path / "out"))
    before = (tmp_path / "out/spark-1/compose.yaml").read_text()
    changed = tmp_path / "c.yaml"
    changed.write_text((CASES / "sample.yaml").read_text().replace("WARN", "INFO"))
    result = run("render", str(changed), "-o", str(tmp_path / "out"), "--dry-run")
    assert result.returncode == 0, result.stderr
    assert f"would overwrite  {tmp_path}/out/spark-1/compose.yaml" in result.stdout
    assert '-      "NCCL_DEBUG": "WARN"' in result.stdout
    assert '+      "NCCL_DEBUG": "INFO"' in result.stdout
    assert (tmp_path / "out/spark-1/compose.yaml").read_text() == before


def test_broken_config_exits_2_with_one_line_per_problem_and_writes_nothing(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    text = (CASES / "sample.yaml").read_text()
    bad.write_text(text.replace("192.168.200.13", "192.168.200.12").replace("0.85", "2"))
    result = run("render", str(bad), "-o", str(tmp_path / "out"))
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"{bad} is invalid:",
        "  vllm.gpu_memory_utilization: Input should be less than or equal to 1",
    ]
    assert not (tmp_path / "out").exists()


def test_a_node_removed_from_the_config_is_reported_not_deleted(tmp_path: Path) -> None:
    run("render", str(case("sample.yaml", tmp_path)), "-o", str(tmp_path))
    one = tmp_path / "one.yaml"
    one.write_text(
        (CASES / "sample.yaml")
        .read_text()
        .replace("  - name: spark-2\n    ip: 192.168.200.13\n    context: spark-2\n", "")
        .replace("tensor_parallel_size: 2", "tensor_parallel_size: 1")
    )
    result = run("render", str(one), "-o", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert (
        f"note: {tmp_path}/spark-2 is not a node of qwen35 any more; left as it is" in result.stderr
    )
    assert (tmp_path / "spark-2/compose.yaml").is_file()


def test_schema_is_json_with_a_description_on_every_key() -> None:
    schema = json.loads(run("schema").stdout)
    assert schema["title"] == "Cluster"
    for model in [schema, *schema["$defs"].values()]:
        for name, prop in model["properties"].items():
            assert prop.get("description"), name


def test_the_docs_config_reference_is_the_generated_one() -> None:
    reference = (Path(__file__).parent.parent / "docs" / "reference.md").read_text()
    assert run("schema", "--markdown").stdout in reference, (
        "regenerate: vllm-compose schema --markdown"
    )


def test_a_path_with_brackets_is_printed_as_written_never_read_as_markup(tmp_path: Path) -> None:
    config = case("sample.yaml", tmp_path)
    result = run("render", str(config), "-o", "out[/]x", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "   create  out[/]x/spark-1/compose.yaml" in result.stdout.splitlines()


def test_every_numeric_option_is_bounded_and_refused_before_anything_is_read() -> None:
    """A missing config: were the command to start, it would say it cannot read the config;
    each of these is refused by its option's range first (exit 2, the option named)."""
    cases = [
        ("watch", "--interval", "0"), ("watch", "--interval", "nan"),
        ("watch", "--interval", "inf"), ("watch", "--deadline", "inf"),
        ("watch", "--deadline", "nan"), ("watch", "--heal", "nan"), ("watch", "--backoff", "-1"),
        ("watch", "--failures", "0"), ("watch", "--max-recoveries", "-1"),
        ("up", "--join-timeout", "-1"), ("up", "--serve-timeout", "0"), ("up", "--interval", "inf"),
        ("top", "--interval", "0"), ("top", "--interval", "-1"), ("top", "--interval", "nan"),
        ("bench", "--concurrency", "-2"), ("bench", "--prompts", "0"),
        ("bench", "--input-len", "99999999999"),
    ]  # fmt: skip
    for command, option, value in cases:
        refused = run(command, "missing.yaml", option, value)
        assert refused.returncode == 2, (command, option, value, refused.stderr)
        assert f"Invalid value for '{option}'" in refused.stderr, refused.stderr
        assert "cannot read" not in refused.stderr


@settings(max_examples=60, deadline=None)
@given(
    option=st.sampled_from([("watch", "--interval", 1, 3600), ("watch", "--deadline", 1, 3600),
                            ("watch", "--heal", 0, 3600), ("watch", "--backoff", 0, 3600),
                            ("top", "--interval", 0.5, 3600)]),
    value=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10**6, 10**6)),
)  # fmt: skip
def test_a_seconds_option_takes_exactly_the_values_in_its_range(
    option: tuple[str, str, float, float], value: float
) -> None:
    """In process (the parser alone decides): a value out of range, nan or inf is refused by
    the option; one in range gets as far as reading the (missing) config."""
    import contextlib
    import io
    from unittest import mock

    from generator import cli as commands

    command, flag, low, high = option
    said = io.StringIO()
    argv = ["vllm-compose", command, "missing.yaml", flag, str(value)]
    with (
        contextlib.redirect_stderr(said),
        mock.patch.object(sys, "argv", argv),
        pytest.raises(SystemExit) as exited,
    ):
        commands.main()
    assert exited.value.code == 2
    refused = "Invalid value for" in said.getvalue()
    assert refused == (not low <= value <= high), (argv, said.getvalue())


def test_the_command_list_gives_each_command_one_line_its_first_sentence() -> None:
    """`--help`'s command list: one line per command at a wide terminal (Typer would carry the
    docstrings' hard line breaks into it); each command's own help keeps its whole text."""
    from generator.cli import app

    listed = subprocess.run(
        [sys.executable, "-m", "generator", "--help"],
        capture_output=True, text=True, env={**os.environ, "COLUMNS": "400"},
    )  # fmt: skip
    box = [line for line in listed.stdout.split("Commands")[1].splitlines() if "│" in line]
    assert len(box) == len(app.registered_commands) + len(app.registered_groups), listed.stdout
    assert any(
        "│ upgrade     Move the serving group to the changed config. " in line for line in box
    )
    whole = run("upgrade", "--help").stdout
    assert "If it fails, the stack that served before starts again by itself" in " ".join(
        whole.replace("│", " ").split()
    )


def test_every_command_has_an_example_that_names_only_its_own_options() -> None:
    import typer

    from generator.cli import app

    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    for name, command in group.commands.items():
        words = (command.epilog or "").removeprefix("Example: ").split()
        assert words[:2] == ["vllm-compose", name], command.epilog
        options = {o for p in command.params for o in p.opts}
        assert {w for w in words if w.startswith("-")} <= options, command.epilog
        for sub, inner in getattr(command, "commands", {}).items():  # a group's: `keys add`
            said = (inner.epilog or "").removeprefix("Example: ").split()
            assert said[:3] == ["vllm-compose", name, sub], inner.epilog
    shown = run("logs", "--help").stdout
    assert "Example: vllm-compose logs cluster.yaml --node spark-2 --follow" in shown


def test_watchs_options_are_declared_once_and_reach_the_policy_from_watch_and_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from typer.testing import CliRunner

    from generator.cli import app, cluster
    from generator.operations.watch import Policy

    seen: list[Policy] = []
    monkeypatch.setattr(cluster, "open_config", lambda *a, **k: None)
    monkeypatch.setattr(cluster, "_watch", lambda opened, policy: seen.append(policy))
    given = ["--interval", "5", "--heal", "7", "--max-recoveries", "0"]
    done = CliRunner().invoke(app, ["watch", "c.yaml", *given])
    assert done.exit_code == 0, done.output
    assert seen == [Policy(interval=5, heal=7, max_recoveries=0)]
    refused = CliRunner().invoke(app, ["up", "c.yaml", "--watch", "--interval", "0.5"])
    assert refused.exit_code == 2 and seen == [Policy(interval=5, heal=7, max_recoveries=0)]
