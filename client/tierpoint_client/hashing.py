"""crc32c of files, streamed in chunks through one reused buffer per thread.

crc32c releases the GIL on large buffers, so a thread pool hashes shards in parallel.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import crc32c as _crc32c

CHUNK_SIZE = 4 * 1024 * 1024

_local = threading.local()


def chunk_buffer(size: int) -> memoryview:
    """This thread's reusable buffer of `size` bytes."""
    buf: bytearray | None = getattr(_local, "buf", None)
    if buf is None or len(buf) != size:
        buf = bytearray(size)
        _local.buf = buf
    return memoryview(buf)


def crc32c_hex(value: int) -> str:
    return f"{value & 0xFFFFFFFF:08x}"


def update(crc: int, data: bytes | bytearray | memoryview) -> int:
    value: int = _crc32c.crc32c(data, crc)
    return value


def file_crc32c(path: str | os.PathLike[str], chunk_size: int = CHUNK_SIZE) -> tuple[int, str]:
    """(size, crc32c hex) of a file, read once."""
    view = chunk_buffer(chunk_size)
    crc = 0
    size = 0
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(view)
            if not n:
                break
            crc = update(crc, view[:n])
            size += n
    return size, crc32c_hex(crc)


def hash_files(
    paths: Sequence[str | os.PathLike[str]], workers: int = 8, chunk_size: int = CHUNK_SIZE
) -> list[tuple[int, str]]:
    """(size, crc32c) for each path, in order, hashed by up to `workers` threads."""
    if workers <= 1 or len(paths) <= 1:
        return [file_crc32c(p, chunk_size) for p in paths]
    with ThreadPoolExecutor(max_workers=min(workers, len(paths))) as pool:
        return list(pool.map(lambda p: file_crc32c(p, chunk_size), paths))


# crc32c(A + B) from crc32c(A), crc32c(B) and len(B), as zlib's crc32_combine does it for its CRC
# (x^(8·len B) mod P times crc(A), plus crc(B)), with the CRC-32C polynomial: the crc32c package
# has no combine. Lets a writer hash a large chunk once for two checksums that contain it.
_POLY = 0x82F63B78  # CRC-32C, reflected
_X0 = 1 << 31  # the polynomial 1 (x^0), reflected


def _multmodp(a: int, b: int) -> int:
    """a(x)·b(x) mod P(x), bit-reflected."""
    m, p = _X0, 0
    while True:
        if a & m:
            p ^= b
            if a & (m - 1) == 0:
                return p
        m >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1


def _x2n_table() -> list[int]:
    table, p = [], _X0 >> 1  # x^1
    for _ in range(32):
        table.append(p)
        p = _multmodp(p, p)
    return table


_X2N = _x2n_table()  # x^(2^k) mod P


def combine(crc_a: int, crc_b: int, len_b: int) -> int:
    """crc32c of A followed by B."""
    return _multmodp(_shift(len_b), crc_a) ^ crc_b


@functools.lru_cache(maxsize=256)
def _shift(len_b: int) -> int:
    """x^(8·len_b) mod P: a reader combines thousands of pieces of a few lengths."""
    p, k, n = _X0, 3, len_b  # n·2^3
    while n:
        if n & 1:
            p = _multmodp(_X2N[k & 31], p)
        n >>= 1
        k += 1
    return p
