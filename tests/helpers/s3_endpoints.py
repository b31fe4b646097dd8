"""The S3 endpoints the tests run against: the session's moto (its keys in the standard AWS
chain) and Ceph's RADOS Gateway (tests/helpers/rgw.py, its keys under an environment prefix
that its tiers name). A test over both says where they differ."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import boto3

from apps.devstack.services import MotoS3Server
from tests.helpers.services import Services
from tierpoint.tier_config import TierConfig, TierKind


@dataclass(frozen=True)
class S3Endpoint:
    kind: str  # "moto" or "rgw"
    url: str
    access_key_id: str
    secret_access_key: str
    region: str
    # The prefix a tier names to sign with these keys; None: the standard AWS chain has them.
    credentials_env: str | None = None
    # The moto server the session started (its request log); None: one it was given, or RGW.
    server: MotoS3Server | None = None

    @property
    def stores_checksums(self) -> bool:
        """Whether the endpoint stores and returns `x-amz-checksum-crc32c` (moto does; Ceph RGW
        16.2 ignores every checksum header, so each copy is verified by reading it back)."""
        return self.kind != "rgw"

    def client(self) -> Any:
        """A plain boto3 client with these keys, as another program (or an attacker) would."""
        return boto3.client(
            "s3",
            endpoint_url=self.url,
            region_name=self.region,
            aws_access_key_id=self.access_key_id,
            aws_secret_access_key=self.secret_access_key,
        )

    def make_bucket(self) -> str:
        bucket = f"tp-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=bucket)
        return bucket

    def tier(self, name: str = "s3", **changes: Any) -> TierConfig:
        """An s3 tier on a new bucket of this endpoint, signing with its keys."""
        fields: dict[str, Any] = {
            "name": name,
            "kind": TierKind.S3,
            "bucket": self.make_bucket(),
            "endpoint_url": self.url,
            "region": self.region,
            "credentials_env": self.credentials_env,
        }
        return TierConfig(**(fields | changes))


def moto_endpoint(services: Services) -> S3Endpoint:
    return S3Endpoint(
        "moto",
        services.s3_endpoint_url,
        services.s3_access_key_id,
        services.s3_secret_access_key,
        services.s3_region,
    )
