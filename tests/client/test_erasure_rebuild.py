"""A lost stripe cut again from k others on real files (`rebuild_path`): byte for byte the
stripe the encoder cut, for every index and across segment boundaries; a rotten stripe among
the others is caught by its crc32c and read around; a set that cannot prove its file leaves
nothing under the destination's name."""

from __future__ import annotations

import random
from pathlib import Path

import crc32c
import pytest
from tierpoint_client.erasure import (
    SEGMENT_BYTES,
    Code,
    FileMismatchError,
    NotEnoughStripesError,
    StripeFile,
    encode_path,
)
from tierpoint_client.erasure.files import rebuild_path

CODE = Code(4, 2)


def _set(data: bytes, folder: Path) -> list[StripeFile]:
    src = folder / "file"
    src.write_bytes(data)
    dests = [folder / f"stripe.{i}" for i in range(CODE.width)]
    infos = encode_path(CODE, src, dests)
    return [StripeFile(i.index, d, i.crc32c) for i, d in zip(infos, dests, strict=True)]


def _crc(data: bytes) -> str:
    return f"{crc32c.crc32c(data):08x}"


@pytest.mark.parametrize("size", [1, 4099, SEGMENT_BYTES + 4099])
def test_every_lost_stripe_is_cut_again_to_the_encoders_bytes(size: int, tmp_path: Path) -> None:
    data = random.Random(size).randbytes(size)
    stripes = _set(data, tmp_path)
    for lost in range(CODE.width):
        others = [s for s in stripes if s.index != lost]
        dest = tmp_path / f"rebuilt.{lost}"
        done = rebuild_path(CODE, size, _crc(data), others, lost, dest)
        want = stripes[lost].path.read_bytes()
        assert dest.read_bytes() == want
        assert done.rebuilt is not None
        assert (done.rebuilt.size, done.rebuilt.crc32c) == (len(want), stripes[lost].crc32c)
        assert lost not in done.used and len(done.used) == CODE.k


def test_a_rotten_stripe_among_the_others_is_read_around(tmp_path: Path) -> None:
    data = random.Random(1).randbytes(SEGMENT_BYTES + 77)
    stripes = _set(data, tmp_path)
    was = stripes[0].path.read_bytes()
    stripes[0].path.write_bytes(was[:100] + bytes([was[100] ^ 0x10]) + was[101:])
    dest = tmp_path / "rebuilt.5"
    done = rebuild_path(CODE, len(data), _crc(data), stripes[:5], 5, dest)
    assert 0 in done.rejected and 0 not in done.used
    assert _crc(dest.read_bytes()) == stripes[5].crc32c


def test_with_k_others_one_rotten_nothing_is_written(tmp_path: Path) -> None:
    data = random.Random(2).randbytes(9000)
    stripes = _set(data, tmp_path)
    was = stripes[1].path.read_bytes()
    stripes[1].path.write_bytes(was[:-1] + bytes([was[-1] ^ 0x01]))
    dest = tmp_path / "rebuilt.4"
    with pytest.raises(NotEnoughStripesError):
        rebuild_path(CODE, len(data), _crc(data), [stripes[i] for i in (0, 1, 2, 3)], 4, dest)
    assert not dest.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".rebuilt")]


def test_a_set_that_does_not_give_the_registered_file_writes_nothing(tmp_path: Path) -> None:
    data = random.Random(3).randbytes(9000)
    stripes = _set(data, tmp_path)
    dest = tmp_path / "rebuilt.0"
    with pytest.raises(FileMismatchError):
        rebuild_path(CODE, len(data), "00000000", stripes[1:], 0, dest)
    assert not dest.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".rebuilt")]
