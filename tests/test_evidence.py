"""The diagnostics bundle's redaction on its own (the bundle itself is written on the testbed in
test_recovery.py and test_e2e.py)."""

from __future__ import annotations

import types
from pathlib import Path

from generator.operations import evidence


def test_a_secrets_contents_are_hidden_wherever_they_appear(tmp_path: Path) -> None:
    key = tmp_path / "c.state" / "api-key"
    key.parent.mkdir()
    key.write_text("s3cr3t-value-1234\n")
    fleet = types.SimpleNamespace(secret_files={"api_key": key})
    hide = evidence._redactor(fleet)  # type: ignore[arg-type]
    said = 'curl -H "Authorization: Bearer s3cr3t-value-1234" ...'
    assert hide(said) == 'curl -H "Authorization: Bearer <redacted>" ...'


def test_variables_named_like_a_secret_are_hidden_and_the_rest_kept() -> None:
    assert evidence._hidden("HF_TOKEN=hf_abc") == "HF_TOKEN=<redacted>"
    assert evidence._hidden("MY_API_KEY=x=y") == "MY_API_KEY=<redacted>"
    assert (
        evidence._hidden("NCCL_SOCKET_IFNAME=enP2p1s0f1np1") == "NCCL_SOCKET_IFNAME=enP2p1s0f1np1"
    )
