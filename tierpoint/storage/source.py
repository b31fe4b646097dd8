"""Reading a copy's source (a `ByteSource`), shared by every backend's write."""

from __future__ import annotations

from tierpoint.storage.base import ByteSource, ShardRef, SourceSizeMismatch


def read_full(source: ByteSource, buffer: memoryview) -> int:
    """Fill buffer from source; fewer bytes only at end of stream."""
    readinto = getattr(source, "readinto", None)
    got = 0
    want = len(buffer)
    while got < want:
        if readinto is not None:
            n = readinto(buffer[got:])
        else:
            data = source.read(want - got)
            n = len(data)
            buffer[got : got + n] = data
        if not n:
            break
        got += n
    return got


def position_source(source: ByteSource, current: int, wanted: int) -> None:
    """Move the source from where the caller put it to where the copy really starts."""
    if current != wanted:
        source.seek(wanted)


def check_source_end(ref: ShardRef, source: ByteSource, size: int) -> None:
    if read_full(source, memoryview(bytearray(1))):
        raise SourceSizeMismatch(f"source of {ref.path!r} holds more than {size} bytes")
