"""Storage class, server-side encryption and tags reach every object an S3 tier writes, through
both write paths (one PutObject, and a multipart upload): checked on the objects themselves."""

from __future__ import annotations

import io
from typing import Any

import pytest
from botocore.exceptions import ClientError
from pydantic import ValidationError

from tests.helpers.s3_endpoints import S3Endpoint, moto_endpoint
from tests.helpers.services import Services
from tests.helpers.storage import MiB, Progress, new_ref, random_bytes
from tierpoint.storage.registry import s3_client
from tierpoint.storage.s3.layout import FLAT
from tierpoint.storage.s3.store import S3Store
from tierpoint.tier_config import TierConfig, TierKind

SIZES = {"single PutObject": 1 * MiB, "multipart": 11 * MiB + 3}


@pytest.fixture
def s3_endpoint(services: Services) -> S3Endpoint:
    """These options as AWS S3 has them, which moto follows. Ceph RGW 16.2 refuses a storage
    class it was not configured with (below) and ignores SSE-S3, so they are not run there."""
    return moto_endpoint(services)


def store_with(s3_tier: TierConfig, **options: Any) -> S3Store:
    tier = TierConfig.model_validate({**s3_tier.model_dump(exclude_unset=True), **options})
    return S3Store(tier, s3_client(tier.endpoint_url, tier.region, credentials=tier), layout=FLAT)


@pytest.mark.parametrize("size", SIZES.values(), ids=SIZES.keys())
def test_rgw_refuses_a_storage_class_it_was_not_configured_with(rgw: S3Endpoint, size: int) -> None:
    """The write fails with the gateway's own answer, and leaves neither an object nor an
    upload behind (the copy fails and is retried until the tier's setting is fixed)."""
    store = store_with(rgw.tier(multipart_part_size=5 * MiB), storage_class="STANDARD_IA")
    ref = new_ref("model/ia.bin")
    with pytest.raises(ClientError, match=r"InvalidArgument|InvalidStorageClass"):
        store.write(ref, io.BytesIO(random_bytes(size)), size, None, Progress())
    assert store.size(ref) is None
    assert rgw.client().list_multipart_uploads(Bucket=store.bucket).get("Uploads", []) == []


@pytest.mark.parametrize("size", SIZES.values(), ids=SIZES.keys())
def test_storage_class_sse_and_tags_on_every_object(
    s3_tier: TierConfig, raw_s3: Any, size: int
) -> None:
    store = store_with(
        s3_tier,
        storage_class="STANDARD_IA",
        sse="AES256",
        tags={"team": "llm", "cost-centre": "pre-train/7 b"},
    )
    ref = new_ref("model/shard.bin")
    data = random_bytes(size)
    store.write(ref, io.BytesIO(data), size, None, Progress())
    head = raw_s3.head_object(Bucket=store.bucket, Key=store.key(ref))
    assert head["StorageClass"] == "STANDARD_IA"
    assert head["ServerSideEncryption"] == "AES256"
    tags = raw_s3.get_object_tagging(Bucket=store.bucket, Key=store.key(ref))["TagSet"]
    assert {t["Key"]: t["Value"] for t in tags} == {"team": "llm", "cost-centre": "pre-train/7 b"}
    assert store.verify(ref, size, store.checksum(ref).crc32c or "").ok


@pytest.mark.parametrize("size", SIZES.values(), ids=SIZES.keys())
def test_sse_kms_with_a_key_and_a_bucket_key(s3_tier: TierConfig, raw_s3: Any, size: int) -> None:
    key_id = "arn:aws:kms:us-east-1:123456789012:key/checkpoints"
    store = store_with(s3_tier, sse="aws:kms", kms_key_id=key_id, bucket_key=True)
    ref = new_ref("model/kms.bin")
    store.write(ref, io.BytesIO(random_bytes(size)), size, None, Progress())
    head = raw_s3.head_object(Bucket=store.bucket, Key=store.key(ref))
    assert head["ServerSideEncryption"] == "aws:kms"
    assert head["SSEKMSKeyId"] == key_id
    if size <= 5 * MiB:
        # moto keeps the bucket-key flag of a PutObject but drops that of a multipart upload;
        # S3 keeps both. The request carries it either way (the same arguments, one mapping).
        assert head["BucketKeyEnabled"] is True


def test_standard_class_sends_no_storage_class_header(s3_tier: TierConfig, raw_s3: Any) -> None:
    store = store_with(s3_tier)
    ref = new_ref("model/plain.bin")
    store.write(ref, io.BytesIO(b"x" * 10), 10, None, Progress())
    head = raw_s3.head_object(Bucket=store.bucket, Key=store.key(ref))
    # S3 omits StorageClass for STANDARD objects.
    assert head.get("StorageClass", "STANDARD") == "STANDARD"
    assert "ServerSideEncryption" not in head or head["ServerSideEncryption"] == "AES256"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"kind": "shared", "root": "/x", "storage_class": "GLACIER_IR"}, "S3 tiers only"),
        ({"kind": "s3", "bucket": "b", "kms_key_id": "k"}, "need sse"),
        ({"kind": "s3", "bucket": "b", "sse": "aws:kms", "bucket_key": True}, None),
        ({"kind": "s3", "bucket": "b", "storage_class": "COLD"}, "storage_class"),
        ({"kind": "s3", "bucket": "b", "sse": "rot13"}, "sse"),
        ({"kind": "s3", "bucket": "b", "tags": {"team": "r&d"}}, "S3 allows letters"),
    ],
)
def test_options_are_checked_when_the_config_is_read(
    options: dict[str, Any], message: str | None
) -> None:
    if message is None:
        TierConfig.model_validate({"name": "t", **options})
        return
    with pytest.raises(ValidationError, match=message):
        TierConfig.model_validate({"name": "t", **options})


def test_archive_classes_need_a_restore_request() -> None:
    def tier(cls: str) -> TierConfig:
        return TierConfig(name="a", kind=TierKind.S3, bucket="b", storage_class=cls)

    assert tier("GLACIER").needs_restore_request
    assert tier("DEEP_ARCHIVE").needs_restore_request
    assert not tier("GLACIER_IR").needs_restore_request
    assert not tier("STANDARD").needs_restore_request
