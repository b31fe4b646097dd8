"""A copy on a POSIX tier (a node's local tier, or the shared one): a file opened at the path the
catalog names, read with positional reads straight into place."""

from __future__ import annotations

import os
from collections.abc import Generator

from tierpoint_client.errors import SourceError
from tierpoint_client.hashing import update
from tierpoint_client.models import PlanEntry
from tierpoint_client.sources.base import Mismatch, Placement, Segment, Sink
from tierpoint_client.sources.placing import READ_THREADS, check, in_parallel, pieces, target


class FileSource:
    """A file read placed: once, in pieces by the reader threads straight into the memory the
    placement gives (in file order, on this thread, when a copy is written as it goes)."""

    def __init__(self, entry: PlanEntry, threads: int = READ_THREADS) -> None:
        self.entry = entry
        self.threads = threads

    def chunks(self, chunk_size: int) -> Generator[memoryview, None, None]:
        location = self.entry.location
        view = memoryview(bytearray(chunk_size))
        try:
            f = open(location, "rb", buffering=0)  # noqa: SIM115 - closed in finally of a generator
        except FileNotFoundError:
            raise SourceError(f"restore source {location} does not exist") from None
        except OSError as e:
            raise SourceError(f"restore source {location} cannot be opened: {e}") from None
        try:
            while True:
                try:
                    n = f.readinto(view)
                except OSError as e:
                    raise SourceError(f"restore source {location} cannot be read: {e}") from None
                if not n:
                    return
                yield view[:n]
        finally:
            f.close()

    def read_into(self, placement: Placement, copy: Sink | None) -> None:
        entry = self.entry
        try:
            fd = os.open(entry.location, os.O_RDONLY)
        except FileNotFoundError:
            raise SourceError(f"restore source {entry.location} does not exist") from None
        try:
            size = os.fstat(fd).st_size
            if size != entry.size:
                raise Mismatch(f"{size} bytes, registered {entry.size}")
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            parts = pieces(placement.segments(lambda off, n: _pread(fd, off, n)), entry.size)
            if copy is None and self.threads > 1 and len(parts) > 1:
                crcs = in_parallel(lambda p: [_read_piece(fd, p)[1]], parts, self.threads)
            else:
                crcs = []
                for piece in parts:
                    view, crc = _read_piece(fd, piece)
                    crcs.append(crc)
                    if copy is not None:
                        copy.write(view, crc)
            check(entry, parts, crcs)
        finally:
            os.close(fd)


def _pread(fd: int, offset: int, length: int) -> memoryview:
    view = memoryview(bytearray(length))
    got = 0
    while got < length:
        n = os.preadv(fd, [view[got:]], offset + got)
        if not n:
            break
        got += n
    return view[:got]


def _read_piece(fd: int, piece: Segment) -> tuple[memoryview, int]:
    """The piece's bytes, read where they go unless the placement holds them already, and their
    crc32c."""
    view = target(piece)
    if not piece.filled:
        got = 0
        while got < piece.length:
            n = os.preadv(fd, [view[got:]], piece.offset + got)
            if not n:
                raise Mismatch(f"ends at {piece.offset + got}: shorter than registered")
            got += n
    return view, update(0, view)
