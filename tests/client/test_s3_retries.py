"""The client's S3 reads retry in adaptive mode with 9 attempts unless the AWS SDK's own settings
(environment or profile) say otherwise: what each source gives the client that restores read
through. No request is sent."""

from __future__ import annotations

from pathlib import Path

import pytest
from tierpoint_client.models import TierInfo
from tierpoint_client.s3 import client_for

TIER = TierInfo("s3", "s3", None, "bucket", "", "http://127.0.0.1:9", "us-east-1")


@pytest.fixture(autouse=True)
def _no_machine_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_RETRY_MODE", "AWS_MAX_ATTEMPTS", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))


def _retries() -> dict[str, object]:
    # The retry settings as botocore resolved them for this client.
    resolved: dict[str, object] = getattr(client_for(TIER).meta.config, "retries")  # noqa: B009
    return resolved


def test_adaptive_with_nine_attempts_by_default() -> None:
    assert _retries() == {"mode": "adaptive", "total_max_attempts": 9}


def test_the_environment_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_RETRY_MODE", "standard")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "3")
    assert _retries() == {"mode": "standard", "total_max_attempts": 3}


def test_the_profile_wins_for_what_it_sets(tmp_path: Path) -> None:
    (tmp_path / "config").write_text("[default]\nmax_attempts = 4\n")
    assert _retries() == {"mode": "adaptive", "total_max_attempts": 4}
