"""Reading a copy's source (a `ByteSource`), shared by every backend's write."""

from __future__ import annotations

from collections.abc import Callable

from tierpoint.storage.base import ByteSource, ShardRef, SourceSizeMismatch

# A source read through a bandwidth limit takes size / limit: a whole S3 part (16 MiB by
# default) read in one piece from a node's local tier, whose limit every copy off it shares, went
# unheard of longer than the heartbeat timeout, and every retry was timed out in turn.
TICK_BYTES = 4 * 1024 * 1024


def read_full(
    source: ByteSource, buffer: memoryview, tick: Callable[[], None] | None = None
) -> int:
    """Fill buffer from source; fewer bytes only at end of stream. With `tick`, read at most
    TICK_BYTES at a time and call it between reads (a heartbeat)."""
    readinto = getattr(source, "readinto", None)
    got = 0
    want = len(buffer)
    while got < want:
        end = want if tick is None else min(want, got + TICK_BYTES)
        if readinto is not None:
            n = readinto(buffer[got:end])
        else:
            data = source.read(end - got)
            n = len(data)
            buffer[got : got + n] = data
        if not n:
            break
        got += n
        if tick is not None and got < want:
            tick()
    return got


def position_source(source: ByteSource, current: int, wanted: int) -> None:
    """Move the source from where the caller put it to where the copy really starts."""
    if current != wanted:
        source.seek(wanted)


def check_source_end(ref: ShardRef, source: ByteSource, size: int) -> None:
    if read_full(source, memoryview(bytearray(1))):
        raise SourceSizeMismatch(f"source of {ref.path!r} holds more than {size} bytes")
