from __future__ import annotations

import crc32c
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tierpoint.storage.checksum import (
    crc32c_combine,
    crc32c_from_base64,
    crc32c_hex,
    crc32c_of,
    crc32c_to_base64,
    crc32c_update,
    parse_crc32c,
)


def test_known_value() -> None:
    # The CRC-32C check value.
    assert crc32c_hex(crc32c_of(b"123456789")) == "e3069283"
    assert crc32c_to_base64(crc32c_of(b"")) == "AAAAAA=="


@given(st.binary(max_size=300), st.binary(max_size=300))
def test_update_and_combine_agree_with_one_pass(a: bytes, b: bytes) -> None:
    whole = crc32c.crc32c(a + b)
    assert crc32c_update(crc32c_of(a), b) == whole
    assert crc32c_combine(crc32c_of(a), crc32c_of(b), len(b)) == whole


def test_combine_over_large_lengths() -> None:
    a = b"x" * 1000
    b = bytes(range(256)) * 40_000  # ~10 MB
    assert crc32c_combine(crc32c_of(a), crc32c_of(b), len(b)) == crc32c_of(a + b)


@given(st.integers(min_value=0, max_value=0xFFFFFFFF))
def test_hex_and_base64_round_trip(v: int) -> None:
    assert parse_crc32c(crc32c_hex(v)) == v
    assert len(crc32c_hex(v)) == 8 and crc32c_hex(v) == crc32c_hex(v).lower()
    assert crc32c_from_base64(crc32c_to_base64(v)) == v


@pytest.mark.parametrize(
    "s", ["", "1234567", "123456789", "0x123456", "ghijklmn", " 1234567", "1234567\n"]
)
def test_parse_refuses_malformed(s: str) -> None:
    with pytest.raises(ValueError):
        parse_crc32c(s)


def test_parse_accepts_upper_case() -> None:
    assert parse_crc32c("E3069283") == 0xE3069283


@pytest.mark.parametrize("s", ["", "AAAA", "not base64!", "AAAAAAAA"])
def test_from_base64_refuses_malformed(s: str) -> None:
    with pytest.raises(ValueError):
        crc32c_from_base64(s)
