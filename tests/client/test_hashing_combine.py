"""crc32c of a concatenation from its parts' checksums (what TierpointWriter folds each chunk's
checksum into the item's and the file's with), against the crc32c library on real bytes."""

from __future__ import annotations

import os

import crc32c
import pytest
from tierpoint_client.hashing import combine


@pytest.mark.parametrize(
    ("len_a", "len_b"),
    [(0, 0), (0, 7), (7, 0), (1, 1), (100, 1000), (12_345, 1 << 20), (3, (8 << 20) + 5)],
)
def test_combine_is_the_crc32c_of_the_concatenation(len_a: int, len_b: int) -> None:
    a, b = os.urandom(len_a), os.urandom(len_b)
    assert combine(crc32c.crc32c(a), crc32c.crc32c(b), len_b) == crc32c.crc32c(a + b)


def test_combine_folds_many_chunks_like_one_pass() -> None:
    chunks = [os.urandom(n) for n in (64, 1, 4096, 0, 333, 1 << 16)]
    crc = 0
    for c in chunks:
        crc = combine(crc, crc32c.crc32c(c), len(c))
    assert crc == crc32c.crc32c(b"".join(chunks))
