"""CRC32C (Castagnoli), hardware accelerated through the `crc32c` package.

Values travel as 8 lowercase hex digits in manifests and the catalog, and as base64 of the 4
big-endian bytes in S3 headers. `crc32c_combine` joins the CRCs of two adjacent byte ranges
without reading them again (used to build a whole-object CRC from per-part CRCs).
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable
from typing import Protocol

import crc32c as _crc32c

_HEX_RE = re.compile(r"[0-9a-fA-F]{8}")
# Reflected CRC-32C polynomial.
_POLY = 0x82F63B78


def crc32c_update(crc: int, data: bytes | bytearray | memoryview) -> int:
    """CRC of (bytes whose CRC is `crc`) followed by `data`."""
    value: int = _crc32c.crc32c(data, crc)
    return value


class _ReadsInto(Protocol):
    def readinto(self, buffer: memoryview, /) -> int | None: ...


def crc32c_of_stream(
    reader: _ReadsInto, buffer_size: int, progress: Callable[[int], None] | None = None
) -> tuple[int, int]:
    """(size, crc32c) of everything `reader` yields, through one reused buffer."""
    buf = memoryview(bytearray(buffer_size))
    crc = 0
    total = 0
    while n := reader.readinto(buf):
        crc = crc32c_update(crc, buf[:n])
        total += n
        if progress is not None:
            progress(total)
    return total, crc


def crc32c_of(data: bytes | bytearray | memoryview) -> int:
    return crc32c_update(0, data)


def crc32c_hex(value: int) -> str:
    if not 0 <= value <= 0xFFFFFFFF:
        raise ValueError(f"crc32c value {value} is out of range")
    return f"{value:08x}"


def parse_crc32c(s: str) -> int:
    """8 hex digits (either case) -> int; anything else is a ValueError."""
    if not isinstance(s, str) or not _HEX_RE.fullmatch(s):
        raise ValueError(f"crc32c must be exactly 8 hex digits, got {s!r}")
    return int(s, 16)


def crc32c_to_base64(value: int) -> str:
    """The S3 header form (x-amz-checksum-crc32c)."""
    return base64.b64encode(value.to_bytes(4, "big")).decode("ascii")


def crc32c_from_base64(s: str) -> int:
    try:
        raw = base64.b64decode(s, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"not a base64 crc32c: {s!r}") from None
    if len(raw) != 4:
        raise ValueError(f"not a base64 crc32c: {s!r}")
    return int.from_bytes(raw, "big")


def _multmodp(a: int, b: int) -> int:
    """a * b modulo the CRC polynomial, both in reflected bit order."""
    m = 1 << 31
    p = 0
    while True:
        if a & m:
            p ^= b
            if (a & (m - 1)) == 0:
                break
        m >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1
    return p


def _x2n_table() -> list[int]:
    # table[k] = x^(2^k) mod p
    table = [1 << 30]  # x^1
    for _ in range(31):
        table.append(_multmodp(table[-1], table[-1]))
    return table


_X2N = _x2n_table()


def _x8nmodp(n: int) -> int:
    """x^(8n) mod p: the shift that appending n zero bytes applies to a CRC."""
    xp = 1 << 31  # x^0
    k = 3
    while n:
        if n & 1:
            xp = _multmodp(_X2N[k & 31], xp)
        n >>= 1
        k += 1
    return xp


def crc32c_combine(crc1: int, crc2: int, len2: int) -> int:
    """CRC of A+B from crc1 = CRC(A), crc2 = CRC(B) and len2 = len(B)."""
    if len2 < 0:
        raise ValueError("len2 must be >= 0")
    if len2 == 0:
        return crc1
    return _multmodp(_x8nmodp(len2), crc1) ^ crc2
