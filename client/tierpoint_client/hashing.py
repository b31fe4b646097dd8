"""crc32c of files, streamed in chunks through one reused buffer per thread.

crc32c releases the GIL on large buffers, so a thread pool hashes shards in parallel.
"""

from __future__ import annotations

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
