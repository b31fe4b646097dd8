"""Credentials per tier: one process, two S3 endpoints (moto, whose keys are in the AWS chain,
and a real Ceph RADOS Gateway), each tier signing with its own keys: an environment prefix or a
named profile. A tier whose variables are missing fails; it never signs with the chain's keys."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from botocore.exceptions import ClientError
from pydantic import ValidationError

from tests.helpers.s3_endpoints import S3Endpoint, moto_endpoint
from tests.helpers.services import Services
from tests.helpers.storage import new_ref
from tierpoint.storage.registry import open_store
from tierpoint.storage.s3.credentials import MissingTierCredentials
from tierpoint.storage.s3.layout import FLAT
from tierpoint.tier_config import TierConfig


def _round_trip(tier: TierConfig) -> None:
    store = open_store(tier, None, FLAT)
    ref = new_ref("a.bin")
    result = store.write(ref, io.BytesIO(b"checkpoint"), 10, None, None)
    assert store.verify(ref, 10, result.crc32c).ok


def test_two_endpoints_in_one_process_each_with_its_keys(
    services: Services, rgw: S3Endpoint
) -> None:
    _round_trip(moto_endpoint(services).tier(name="moto"))
    _round_trip(rgw.tier(name="rgw"))
    # The same gateway tier without its own credentials signs with the chain's (moto's) keys.
    with pytest.raises(ClientError, match=r"InvalidAccessKeyId|403|Forbidden"):
        _round_trip(rgw.tier(name="rgw-chain", credentials_env=None))


def test_missing_variables_fail_instead_of_using_the_chain(
    rgw: S3Endpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier = rgw.tier(credentials_env="TIERPOINT_TEST_NOT_SET")
    monkeypatch.delenv("TIERPOINT_TEST_NOT_SET_SECRET_ACCESS_KEY", raising=False)
    monkeypatch.setenv("TIERPOINT_TEST_NOT_SET_ACCESS_KEY_ID", rgw.access_key_id)
    with pytest.raises(MissingTierCredentials, match="TIERPOINT_TEST_NOT_SET_SECRET_ACCESS_KEY"):
        open_store(tier, None, FLAT)


def test_a_named_profile(rgw: S3Endpoint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    credentials = tmp_path / "credentials"
    credentials.write_text(
        f"[gateway]\naws_access_key_id = {rgw.access_key_id}\n"
        f"aws_secret_access_key = {rgw.secret_access_key}\n"
    )
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    _round_trip(rgw.tier(credentials_env=None, credentials_profile="gateway"))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"credentials_env": "A", "credentials_profile": "p"}, "not both"),
        ({"credentials_env": "RGW-KEYS"}, "prefix of environment variables"),
        ({"kind": "shared", "root": "/x", "bucket": None, "credentials_env": "A"}, "S3 tiers"),
    ],
)
def test_settings_are_checked_when_read(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        TierConfig.model_validate({"name": "t", "kind": "s3", "bucket": "b", **fields})
