"""Opaque keyset cursors: base64url of a small JSON object, so clients cannot depend on them."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from tierpoint.errors import RequestInvalid


def encode_cursor(key: Any) -> str:
    raw = json.dumps({"v": 1, "k": key}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str, kind: type) -> Any:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        data = json.loads(raw)
        key = data["k"]
        if data.get("v") != 1 or type(key) is not kind:
            raise ValueError
    except (binascii.Error, ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise invalid_cursor() from None
    return key


def invalid_cursor() -> RequestInvalid:
    """The error of a cursor this API did not return (also for one that decodes but whose key
    does not have the shape the endpoint's cursors have)."""
    return RequestInvalid(
        "cursor is not one this API returned",
        errors=[
            {
                "field": "cursor",
                "location": "query",
                "message": "invalid cursor",
                "code": "invalid_cursor",
            }
        ],
    )
