"""Fixtures for the tier backends: real directories under tmp_path, the session's real moto S3."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers.services import Services, make_bucket
from tests.helpers.services import s3_client as session_s3_client
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


@pytest.fixture
def s3_tier(services: Services) -> TierConfig:
    return TierConfig(
        name="s3",
        kind=TierKind.S3,
        bucket=make_bucket(services),
        prefix="ckpt/",
        endpoint_url=services.s3_endpoint_url,
        region=services.s3_region,
        multipart_part_size=5 * MiB,
        multipart_concurrency=2,
    )


@pytest.fixture
def s3_store(s3_tier: TierConfig) -> S3Store:
    return S3Store(s3_tier, s3_client(s3_tier.endpoint_url, s3_tier.region), layout=FLAT)


@pytest.fixture
def raw_s3(services: Services) -> Any:
    """A plain boto3 client, as another program (or an attacker) would use the bucket."""
    return session_s3_client(services)
