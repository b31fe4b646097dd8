"""A coded copy as TierpointReader's source reads it (`sources.coded_read.CodedSource`), its
stripes served over HTTP by several holders (rs(4,2), and rs(2,1) whose fragments are longer
than one read): with every data stripe there the file is joined from them, and a large file's
data stripes land straight in the placement's memory (its heads one ranged GET each, a head
flipped in transit failing the file); a holder down, a data stripe gone or flipped, and a parity
stripe then cut off in transit are read around with a warning each, and only the stripes whose
bytes arrived and did not match are reported; with more than m bad the copy is one that cannot
be read (SourceError), and nothing decoded from a bad stripe is handed on."""

from __future__ import annotations

import dataclasses
import functools
import http.server
import random
import re
import threading
import urllib.request
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, ClassVar, cast

import crc32c
import pytest
from tierpoint_client.erasure import Code, encode_path
from tierpoint_client.erasure.fetch import StripeRef
from tierpoint_client.erasure.join import InMemory, join
from tierpoint_client.errors import SourceError
from tierpoint_client.models import PlanEntry, PlanStripe
from tierpoint_client.sources import Pread, Segment, Sources
from tierpoint_client.sources.coded_read import CodedSource

from apps.devstack.services import free_port
from tests.client.test_erasure_fetch import holders  # noqa: F401  (the holders' server)

CODE = Code(4, 2)
SIZE = 9 * 1024 * 1024 + 12345  # three segments, the last one short


def _entry(
    served: Path, base: str, cut: tuple[int, ...] = (), code: Code = CODE
) -> tuple[bytes, PlanEntry]:
    data = random.Random(11).randbytes(SIZE)
    src = served.parent / "original"
    src.write_bytes(data)
    infos = encode_path(code, src, [served / f"s{i}" for i in range(code.width)])
    stripes = tuple(
        PlanStripe(
            i.index,
            f"node-{i.index}",
            f"{base}/s{i.index}" + ("-cut" if i.index in cut else ""),
            i.size,
            i.crc32c,
        )
        for i in infos
    )
    entry = PlanEntry(
        "model.distcp",
        SIZE,
        f"{crc32c.crc32c(data):08x}",
        "coded",
        "peer",
        None,
        f"{CODE} stripes",
        code=str(code),
        stripes=stripes,
    )
    return data, entry


def _reporting(entry: PlanEntry) -> tuple[bytes, list[int]]:
    """The file, and the stripes the read reported, by index, in the order reported."""
    reported: list[int] = []
    source = Sources({}, "a-token", lambda e, index, why: reported.append(index)).open(entry)
    assert isinstance(source, CodedSource)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = bytes(source.decoded())
    return got, reported


def _read(entry: PlanEntry) -> tuple[bytes, list[str]]:
    source = Sources({}, "a-token").open(entry)
    assert isinstance(source, CodedSource)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = bytes(source.decoded())
    return got, [str(w.message) for w in caught]


def test_every_data_stripe_there_the_file_is_joined_from_them(
    holders: tuple[Path, str],  # noqa: F811
) -> None:
    served, base = holders
    data, entry = _entry(served, base)
    got, warned = _read(entry)
    assert got == data and warned == []


def test_stripes_whose_fragments_are_longer_than_a_read_are_joined_whole(
    holders: tuple[Path, str],  # noqa: F811
) -> None:
    # rs(2,1): each data stripe carries 2 MiB of every 4 MiB segment, read a piece at a time.
    served, base = holders
    data, entry = _entry(served, base, code=Code(2, 1))
    got, warned = _read(entry)
    assert got == data and warned == []


def test_a_stripe_gone_and_one_cut_off_in_transit_are_read_around(
    holders: tuple[Path, str],  # noqa: F811
) -> None:
    served, base = holders
    # Data stripe 0 gone from its holder; parity stripe 4's holder dies mid-reply: the file is
    # decoded from 1, 2, 3 and 5.
    data, entry = _entry(served, base, cut=(4,))
    (served / "s0").unlink()
    got, warned = _read(entry)
    assert got == data
    # Each stripe read around said, in the order it was found out.
    assert len(warned) == 2, warned
    assert "stripe 0 from" in warned[0] and "stripe 4" in warned[1], warned


def test_only_the_stripes_whose_bytes_did_not_match_are_reported(
    holders: tuple[Path, str],  # noqa: F811
) -> None:
    served, base = holders
    # Data stripe 0 gone from its holder, parity stripe 4 cut off mid-reply: neither could be
    # read, which says nothing of the bytes their holders keep. Nothing is reported.
    data, entry = _entry(served, base, cut=(4,))
    (served / "s0").unlink()
    assert _reporting(entry) == (data, [])
    # Data stripe 1 flipped (left out of the join), then parity stripe 4 flipped (left out of
    # the decode that replaced it): both reported, once the file decoded from 0, 2, 3 and 5.
    data, entry = _entry(served, base)
    for i in (1, 4):
        rotten = bytearray((served / f"s{i}").read_bytes())
        rotten[len(rotten) // 2] ^= 0x10
        (served / f"s{i}").write_bytes(rotten)
    assert _reporting(entry) == (data, [1, 4])


def test_more_than_m_stripes_bad_is_a_copy_that_cannot_be_read(
    holders: tuple[Path, str],  # noqa: F811
) -> None:
    served, base = holders
    _, entry = _entry(served, base, cut=(4,))
    (served / "s0").unlink()
    rotten = bytearray((served / "s5").read_bytes())
    rotten[len(rotten) // 3] ^= 0x04
    (served / "s5").write_bytes(rotten)
    with pytest.raises(SourceError, match="needs 4 good stripes"):
        _read(entry)


def test_a_data_stripe_with_a_flipped_byte_is_read_around(
    holders: tuple[Path, str],  # noqa: F811
) -> None:
    served, base = holders
    data, entry = _entry(served, base)
    rotten = bytearray((served / "s1").read_bytes())
    rotten[len(rotten) // 2] ^= 0x10
    (served / "s1").write_bytes(rotten)
    got, warned = _read(entry)
    assert got == data
    assert len(warned) == 1 and "stripe 1" in warned[0] and "crc32c" in warned[0], warned


class _Ranged(http.server.SimpleHTTPRequestHandler):
    """A holder's endpoint as the reader meets it: whole GETs and one `Range` per request,
    each request counted by kind."""

    protocol_version = "HTTP/1.1"
    asked: ClassVar[list[str]] = []
    flip_ranges: ClassVar[bool] = False  # a byte of every ranged reply flipped in transit

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        path = Path(self.directory) / self.path.strip("/")
        data = path.read_bytes()
        wanted = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range") or "")
        if wanted is None:
            _Ranged.asked.append("whole")
            self.send_response(200)
            body = data
        else:
            _Ranged.asked.append("range")
            start, end = int(wanted[1]), min(int(wanted[2]), len(data) - 1)
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
            body = data[start : end + 1]
            if _Ranged.flip_ranges:
                body = bytes([body[0] ^ 0x20]) + body[1:]
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def ranged_holders(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    served = tmp_path / "served"
    served.mkdir()
    _Ranged.asked.clear()
    _Ranged.flip_ranges = False
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_Ranged, directory=str(served))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield served, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class _Items:
    """A placement as DCP's load makes one: each item's first 4 KiB read first (`pread`) to
    decide where its bytes go, then every byte of the file into one memory."""

    def __init__(self, size: int, items: list[int]) -> None:
        self.memory = memoryview(bytearray(size))
        self.items = items

    def segments(self, pread: Pread) -> Iterator[Segment]:
        # Lazily, as DCP's placement: a head is read once every byte before it is placed.
        pos = 0
        for start in self.items:
            if start > pos:
                yield Segment(pos, start - pos, self.memory[pos:start])
            head = pread(start, 4096)
            self.memory[start : start + len(head)] = head
            yield Segment(start, len(head), self.memory[start : start + len(head)], True)
            pos = start + len(head)
        yield Segment(pos, len(self.memory) - pos, self.memory[pos:])


BIG = 33 * 1024 * 1024 + 777  # above the reader's STRIPED_MIN: placed straight from stripes
ITEMS = [0, 5 * 1024 * 1024 + 3, 4 * 1024 * 1024 * 3 - 100]  # one across a stripe's boundary


def _big(served: Path, base: str) -> tuple[bytes, PlanEntry]:
    data = random.Random(13).randbytes(BIG)
    src = served.parent / "original"
    src.write_bytes(data)
    infos = encode_path(CODE, src, [served / f"s{i}" for i in range(CODE.width)])
    stripes = tuple(
        PlanStripe(i.index, f"node-{i.index}", f"{base}/s{i.index}", i.size, i.crc32c)
        for i in infos
    )
    crc = f"{crc32c.crc32c(data):08x}"
    return data, PlanEntry(
        "big.distcp", BIG, crc, "coded", "peer", None, "s", code=str(CODE), stripes=stripes
    )


def test_a_large_file_lands_from_its_data_stripes_straight_in_place(
    ranged_holders: tuple[Path, str],
) -> None:
    served, base = ranged_holders
    data, entry = _big(served, base)
    placement = _Items(BIG, ITEMS)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Sources({}, "a-token").open(entry).read_into(placement, None)
    assert bytes(placement.memory) == data and caught == []
    # One ranged GET per item's head (one more for the head across two stripes), then one GET
    # of each data stripe: nothing read twice into a buffer of the file.
    assert sorted(_Ranged.asked) == ["range"] * (len(ITEMS) + 1) + ["whole"] * CODE.k


def test_a_large_file_with_a_rotten_data_stripe_is_decoded_around_it(
    ranged_holders: tuple[Path, str],
) -> None:
    served, base = ranged_holders
    data, entry = _big(served, base)
    rotten = bytearray((served / "s2").read_bytes())
    rotten[-5] ^= 0x01
    (served / "s2").write_bytes(rotten)
    placement = _Items(BIG, ITEMS)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Sources({}, "a-token").open(entry).read_into(placement, None)
    assert bytes(placement.memory) == data
    assert [str(w.message) for w in caught if "stripe 2" in str(w.message)], caught


def test_a_head_flipped_in_transit_never_reaches_the_tensors(
    ranged_holders: tuple[Path, str],
) -> None:
    served, base = ranged_holders
    _, entry = _big(served, base)
    _Ranged.flip_ranges = True
    placement = _Items(BIG, ITEMS)
    # The stripes themselves are good; the bytes the placement read to decide are not: the
    # file they make does not match, and the copy is given up (the reader reads the next one).
    with pytest.raises(SourceError, match="crc32c"):
        Sources({}, "a-token").open(entry).read_into(placement, None)


def test_a_holder_down_is_read_around(holders: tuple[Path, str]) -> None:  # noqa: F811
    served, base = holders
    data, entry = _entry(served, base)
    # Nothing listens where data stripe 3's holder serves: its connection is refused.
    down = f"http://127.0.0.1:{free_port()}/s3"
    stripes = tuple(dataclasses.replace(s, url=down) if s.index == 3 else s for s in entry.stripes)
    got, warned = _read(dataclasses.replace(entry, stripes=stripes))
    assert got == data
    assert len(warned) == 1 and f"stripe 3 from {down}" in warned[0], warned


def test_a_join_says_which_stripes_did_not_match_and_which_could_not_be_read(
    holders: tuple[Path, str],  # noqa: F811
) -> None:
    # What a caller reports (bytes that arrived and were not the encoder's) against what says
    # nothing of the bytes (a holder down).
    served, base = holders
    _, entry = _entry(served, base)
    rotten = bytearray((served / "s1").read_bytes())
    rotten[7] ^= 0x01
    (served / "s1").write_bytes(rotten)
    down = f"http://127.0.0.1:{free_port()}/s2"
    refs = [
        StripeRef(s.index, s.crc32c, down if s.index == 2 else s.url)
        for s in entry.stripes
        if s.index < CODE.k
    ]

    def open_stripe(ref: StripeRef) -> BinaryIO:
        return cast(BinaryIO, urllib.request.urlopen(ref.where, timeout=60))

    assert entry.crc32c is not None
    buffer = memoryview(bytearray(SIZE))
    left = join(CODE, SIZE, entry.crc32c, refs, open_stripe, InMemory(buffer))
    assert sorted(left) == [1, 2]
    assert left[1].mismatch and "crc32c" in left[1].why
    assert not left[2].mismatch
