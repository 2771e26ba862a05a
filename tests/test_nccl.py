"""Which network NCCL used, read from real NCCL 2.28.9 logs (tests/fixtures/README.md)."""

from __future__ import annotations

from pathlib import Path

from generator.base import nccl

FIXTURES = Path(__file__).parent / "fixtures"


def used(name: str) -> dict[str, list[str]]:
    return nccl.used((FIXTURES / f"nccl-2.28.9-{name}.log").read_text())


def test_the_named_interface_is_what_nccl_used() -> None:
    found = used("named-interface")
    assert found["socket"] == ["lo 127.0.0.1"] and found["bootstrap"] == ["lo 127.0.0.1"]
    assert found["transport"] == ["Socket"] and found["errors"] == []


def test_without_a_name_nccl_took_the_first_interface() -> None:
    found = used("default-interface")
    assert found["socket"] == ["eth0 192.0.2.2"] and found["transport"] == ["Socket"]


def test_a_name_that_matches_no_interface() -> None:
    found = used("absent-interface")
    assert found["socket"] == [] and found["bootstrap"] == []
    assert found["errors"] == ["no socket interface found: NCCL_SOCKET_IFNAME matches no interface"]


def test_a_log_without_nccl_lines_says_nothing() -> None:
    assert nccl.used("INFO:     Application startup complete.\n") == {
        "transport": [], "bootstrap": [], "socket": [], "ib": [], "errors": []
    }  # fmt: skip
