"""The contract of a source: one copy of a file, where a plan entry says it is, and the ways this
client reads it. Every class behind it keeps it (`posix_file.FileSource`,
`peer_endpoint.PeerSource`, `s3_object.S3Source`); which class reads which copy is chosen in one
place (`sources.Sources.open`)."""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from tierpoint_client.models import PlanEntry

Range = tuple[int, int]  # (offset, length) inside a file
Pread = Callable[[int, int], memoryview]  # (offset, length) -> the bytes there (fewer at the end)


class Mismatch(Exception):
    """The bytes of a copy differ from what was registered for them."""


@dataclass(frozen=True)
class Segment:
    """Bytes [offset, offset + length) of a file and where they go: `view` (that many bytes), or
    nowhere (None: read and verified, then dropped). `filled`: the view holds them already (the
    bytes the placement read to decide), so they are hashed, not read again."""

    offset: int
    length: int
    view: memoryview | None = None
    filled: bool = False


class Placement(Protocol):
    """Where the bytes of one file go when it is read: the reader's side of a placed read."""

    def segments(self, pread: Pread) -> Iterable[Segment]:
        """Where every byte of the file goes, in order and without gaps, for one read of one
        copy (called again for the next copy after a failed one). Reads through `pread` go
        front to back, each only once the segments before it were taken (a stream has no
        other order)."""
        ...


class Sink(Protocol):
    """A new local copy that a read writes every byte of the file to, in file order."""

    def write(self, data: memoryview, crc: int) -> None:
        """Append `data`, whose crc32c is `crc`. Never raises: a copy that cannot be written
        drops itself, and the read goes on."""
        ...


class Source(Protocol):
    """One copy of one file. A source that cannot be read raises SourceError, whatever the
    reason (a missing file, a refused or cut connection, an HTTP or S3 error): the caller goes
    on to the next copy. Each call reads the copy anew."""

    entry: PlanEntry

    def chunks(self, chunk_size: int) -> Generator[memoryview, None, None]:
        """The copy's bytes front to back, in chunks of at most `chunk_size` bytes, unverified:
        the caller checks them (a restore stages and verifies them). A chunk is valid until the
        next one is asked for; closing the generator early closes the copy."""
        ...

    def read_into(self, placement: Placement, copy: Sink | None) -> None:
        """Every byte of the file into the memory `placement` gives, each piece through crc32c
        as it lands; returns only when the size and the pieces' crc32c, combined, equal the
        registered ones, and raises Mismatch otherwise (the memory then holds a bad copy's
        bytes: the caller reads the next copy into it, or fails). With `copy`, every byte is
        also written to it, in file order."""
        ...


@runtime_checkable
class RangedSource(Source, Protocol):
    """A source whose bytes cost per request and per byte (S3): one that can fetch only the
    byte ranges a reader needs."""

    def read_ranges(
        self, wanted: Sequence[Range], crcs: Mapping[Range, str]
    ) -> tuple[dict[Range, bytearray], int]:
        """The `wanted` ranges, each verified against its own crc32c in `crcs` (Mismatch
        otherwise), and the bytes fetched."""
        ...
