"""A file restored from stripes served over HTTP by several holders: any k fetched, data stripes
first; a holder down, a stripe with a flipped byte at rest or a stripe gone is treated as lost and
another read in its place; with more than m gone nothing is written and nothing is left behind."""

from __future__ import annotations

import http.client
import io
import random
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO, cast

import crc32c
import pytest
from tierpoint_client.erasure import Code, FileMismatchError, NotEnoughStripesError, encode_path
from tierpoint_client.erasure.fetch import StripeRef, restore_file
from tierpoint_client.transport import sized_readinto

from apps.devstack.services import free_port
from tests.helpers.client import QuietFiles, file_server

CODE = Code(4, 2)
SIZE = 9 * 1024 * 1024 + 12345  # three segments, the last one short


class _Quiet(QuietFiles):
    def do_GET(self) -> None:
        if not self.path.endswith("-cut"):
            super().do_GET()
            return
        # The holder dies mid-reply: the whole stripe's length announced, half of it sent.
        body = (Path(self.directory) / self.path.strip("/").removesuffix("-cut")).read_bytes()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body[: len(body) // 2])
        self.wfile.flush()
        self.close_connection = True


@pytest.fixture
def holders(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """One HTTP server per test standing in for the holders' endpoints: it serves `served/`."""
    served = tmp_path / "served"
    served.mkdir()
    with file_server(served, _Quiet) as base:
        yield served, base


def _set(served: Path, base: str) -> tuple[bytes, str, list[StripeRef]]:
    data = random.Random(7).randbytes(SIZE)
    src = served.parent / "original"
    src.write_bytes(data)
    infos = encode_path(CODE, src, [served / f"s{i}" for i in range(CODE.width)])
    refs = [StripeRef(i.index, i.crc32c, f"{base}/s{i.index}") for i in infos]
    return data, f"{crc32c.crc32c(data):08x}", refs


def _open(ref: StripeRef) -> BinaryIO:
    return cast(BinaryIO, urllib.request.urlopen(ref.where, timeout=60))


class _Body(io.RawIOBase):
    """A GET's body read as the client's transports read one: a body cut off before its
    Content-Length is an IncompleteRead, never the end of the stripe."""

    def __init__(self, resp: http.client.HTTPResponse) -> None:
        self._resp = resp
        self._readinto = sized_readinto(resp)

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        return self._readinto(memoryview(b).cast("B"))

    def close(self) -> None:
        self._resp.close()
        super().close()


def _open_checked(ref: StripeRef) -> BinaryIO:
    resp = urllib.request.urlopen(ref.where, timeout=60)
    return cast(BinaryIO, io.BufferedReader(_Body(resp)))


def _left_behind(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_with_every_holder_up_the_data_stripes_are_read_and_joined(
    holders: tuple[Path, str], tmp_path: Path
) -> None:
    served, base = holders
    data, crc, refs = _set(served, base)
    dest = tmp_path / "restored"
    got = restore_file(CODE, SIZE, crc, refs, _open, dest)
    assert got.used == [0, 1, 2, 3] and not got.rejected
    assert dest.read_bytes() == data and _left_behind(tmp_path) == []


def test_holders_down_and_a_flipped_byte_at_rest_are_read_around(
    holders: tuple[Path, str], tmp_path: Path
) -> None:
    served, base = holders
    data, crc, refs = _set(served, base)
    # Stripe 0's holder is down (nothing listens on its port); stripe 2 rotted on its holder.
    down = f"http://127.0.0.1:{free_port()}/s0"
    refs = [StripeRef(0, refs[0].crc32c, down), *refs[1:]]
    rotten = bytearray((served / "s2").read_bytes())
    rotten[len(rotten) // 2] ^= 0x10
    (served / "s2").write_bytes(rotten)
    dest = tmp_path / "restored"
    got = restore_file(CODE, SIZE, crc, refs, _open, dest)
    assert sorted(got.used) == [1, 3, 4, 5]
    assert sorted(got.rejected) == [0, 2] and "crc32c" in got.rejected[2]
    # Only the stripe whose bytes arrived wrong is a mismatch to report, not the holder down.
    assert list(got.mismatched) == [2]
    assert dest.read_bytes() == data and _left_behind(tmp_path) == []


def test_a_parity_stripes_holder_down_is_read_around_and_not_reported(
    holders: tuple[Path, str], tmp_path: Path
) -> None:
    served, base = holders
    data, crc, refs = _set(served, base)
    # A data stripe rotted, so the file is decoded with parity; the first parity stripe's holder
    # is down (nothing listens on its port).
    rotten = bytearray((served / "s1").read_bytes())
    rotten[len(rotten) // 3] ^= 0x04
    (served / "s1").write_bytes(rotten)
    down = f"http://127.0.0.1:{free_port()}/s4"
    refs = [*refs[:4], StripeRef(4, refs[4].crc32c, down), refs[5]]
    dest = tmp_path / "restored"
    got = restore_file(CODE, SIZE, crc, refs, _open, dest)
    assert sorted(got.used) == [0, 2, 3, 5]
    assert sorted(got.rejected) == [1, 4]
    # The holder down says nothing of the bytes it keeps: only the rotten stripe is reported.
    assert list(got.mismatched) == [1]
    assert dest.read_bytes() == data and _left_behind(tmp_path) == []


def test_more_than_m_stripes_gone_writes_nothing(holders: tuple[Path, str], tmp_path: Path) -> None:
    served, base = holders
    _, crc, refs = _set(served, base)
    (served / "s1").unlink()  # gone: 404
    (served / "s4").write_bytes(b"short")  # not the stripe's size
    rotten = bytearray((served / "s3").read_bytes())
    rotten[0] ^= 1
    (served / "s3").write_bytes(rotten)
    dest = tmp_path / "restored"
    with pytest.raises(NotEnoughStripesError) as e:
        restore_file(CODE, SIZE, crc, refs, _open, dest)
    assert sorted(e.value.rejected) == [1, 3, 4]
    # The rotten and the short one: the one gone (404) says nothing of bytes.
    assert sorted(e.value.mismatched) == [3, 4]
    assert not dest.exists() and _left_behind(tmp_path) == []


def test_a_stripe_cut_off_in_transit_is_read_around(
    holders: tuple[Path, str], tmp_path: Path
) -> None:
    served, base = holders
    data, crc, refs = _set(served, base)
    refs = [refs[0], StripeRef(1, refs[1].crc32c, f"{base}/s1-cut"), *refs[2:]]
    dest = tmp_path / "restored"
    got = restore_file(CODE, SIZE, crc, refs, _open_checked, dest)
    assert sorted(got.used) == [0, 2, 3, 4] and list(got.rejected) == [1]
    assert "IncompleteRead" in got.rejected[1] and got.mismatched == {}
    assert dest.read_bytes() == data and _left_behind(tmp_path) == []


def test_a_parity_stripe_cut_off_in_transit_is_read_around_too(
    holders: tuple[Path, str], tmp_path: Path
) -> None:
    served, base = holders
    data, crc, refs = _set(served, base)
    # Data stripe 0 gone from its holder: parity stripe 4 is read instead, and its holder dies
    # mid-reply: parity stripe 5 makes up the set.
    (served / "s0").unlink()
    refs = [*refs[:4], StripeRef(4, refs[4].crc32c, f"{base}/s4-cut"), refs[5]]
    dest = tmp_path / "restored"
    got = restore_file(CODE, SIZE, crc, refs, _open_checked, dest)
    assert sorted(got.used) == [1, 2, 3, 5] and sorted(got.rejected) == [0, 4]
    assert "IncompleteRead" in got.rejected[4]
    assert dest.read_bytes() == data and _left_behind(tmp_path) == []


def test_stripes_that_match_but_do_not_give_the_registered_file_write_nothing(
    holders: tuple[Path, str], tmp_path: Path
) -> None:
    served, base = holders
    _, crc, refs = _set(served, base)
    # Every stripe the encoder's, the file registered with another crc32c: the set is not it.
    wrong = f"{int(crc, 16) ^ 1:08x}"
    dest = tmp_path / "restored"
    with pytest.raises(FileMismatchError):
        restore_file(CODE, SIZE, wrong, refs, _open, dest)
    assert not dest.exists() and _left_behind(tmp_path) == []
