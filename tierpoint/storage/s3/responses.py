"""What S3's answers mean: error codes, and whether a stored checksum covers the whole object."""

from __future__ import annotations

from typing import Any, Literal

from botocore.exceptions import ClientError

from tierpoint.storage.checksum import crc32c_from_base64

FULL_OBJECT: Literal["FULL_OBJECT"] = "FULL_OBJECT"


def error_code(e: ClientError) -> str:
    return str(e.response.get("Error", {}).get("Code", ""))


def is_not_found(e: ClientError) -> bool:
    return error_code(e) in ("404", "NoSuchKey", "NotFound")


def is_upload_gone(e: ClientError) -> bool:
    """The multipart upload named does not exist (any more): AWS and moto answer NoSuchUpload,
    Ceph RGW NoSuchKey."""
    return error_code(e) in ("NoSuchUpload", "NoSuchKey", "404")


def stored_crc32c(head: dict[str, Any]) -> int | None:
    """The object's whole-content CRC32C as S3 stored it, None if S3 has no such value
    (no CRC32C, or a COMPOSITE checksum of part checksums)."""
    value = head.get("ChecksumCRC32C")
    if not value or "-" in value or head.get("ChecksumType") not in (None, FULL_OBJECT):
        return None
    try:
        return crc32c_from_base64(value)
    except ValueError:
        return None


def whole_object_checksum(head: dict[str, Any]) -> bool:
    """Whether the stored CRC32C certainly covers the whole content: labelled FULL_OBJECT,
    or the object was a single PUT (its ETag has no '-<parts>' suffix)."""
    if head.get("ChecksumType") == FULL_OBJECT:
        return True
    return "-" not in str(head.get("ETag", "")).strip('"')
