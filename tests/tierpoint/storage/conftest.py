"""Fixtures for the tier backends: real directories under tmp_path; the S3 store's tests run on
the session's moto and on a real Ceph RADOS Gateway (`s3_endpoint`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers.s3_endpoints import S3Endpoint, moto_endpoint
from tests.helpers.services import Services
from tests.helpers.storage import MiB
from tierpoint.storage.posix.store import PosixStore
from tierpoint.storage.registry import s3_client
from tierpoint.storage.s3.layout import FLAT
from tierpoint.storage.s3.store import S3Store
from tierpoint.tier_config import TierConfig, TierKind


@pytest.fixture
def shared_root(tmp_path: Path) -> Path:
    root = tmp_path / "lustre"
    root.mkdir()
    return root


@pytest.fixture
def posix_store(shared_root: Path) -> PosixStore:
    # Small buffers so that a few MiB make many chunks (and many resume points).
    tier = TierConfig(name="lustre", kind=TierKind.SHARED, root=str(shared_root))
    return PosixStore(tier, buffer_size=256 * 1024)


@pytest.fixture(params=["moto", "rgw"])
def s3_endpoint(request: pytest.FixtureRequest, services: Services) -> S3Endpoint:
    if request.param == "rgw":
        endpoint: S3Endpoint = request.getfixturevalue("rgw")
        return endpoint
    return moto_endpoint(services)


@pytest.fixture
def s3_tier(s3_endpoint: S3Endpoint) -> TierConfig:
    return s3_endpoint.tier(prefix="ckpt/", multipart_part_size=5 * MiB, multipart_concurrency=2)


@pytest.fixture
def s3_store(s3_tier: TierConfig) -> S3Store:
    client = s3_client(s3_tier.endpoint_url, s3_tier.region, credentials=s3_tier)
    return S3Store(s3_tier, client, layout=FLAT)


@pytest.fixture
def raw_s3(s3_endpoint: S3Endpoint) -> Any:
    """A plain boto3 client, as another program (or an attacker) would use the bucket."""
    return s3_endpoint.client()
