"""What every object written to an S3 tier carries besides its bytes: storage class, server-side
encryption and tags. PutObject and CreateMultipartUpload take the same arguments, so both write
paths share this one mapping and a multipart object cannot end up with other settings."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from tierpoint.tier_config import ServerSideEncryption, StorageClass, TierConfig


def object_write_args(config: TierConfig) -> dict[str, Any]:
    args: dict[str, Any] = {}
    # STANDARD is S3's default; leaving it out keeps requests valid on S3-compatible stores
    # (MinIO, Ceph) that accept no storage class header.
    if config.storage_class is not StorageClass.STANDARD:
        args["StorageClass"] = config.storage_class.value
    if config.sse is not None:
        args["ServerSideEncryption"] = config.sse.value
        if config.sse is ServerSideEncryption.KMS:
            if config.kms_key_id:
                args["SSEKMSKeyId"] = config.kms_key_id
            if config.bucket_key:
                args["BucketKeyEnabled"] = True
    if config.tags:
        args["Tagging"] = urlencode(sorted(config.tags.items()))
    return args
