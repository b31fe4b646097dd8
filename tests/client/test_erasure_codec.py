"""The stripe codec of a coded peer tier, on real files: any k of k+m stripes give the file back,
a stripe with a flipped byte is caught by its crc32c and never used, and a decode that cannot be
proven leaves nothing under the destination's name."""

from __future__ import annotations

import random
import re
import tempfile
from pathlib import Path

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tierpoint_client.erasure import (
    SEGMENT_BYTES,
    Code,
    FileMismatchError,
    InvalidCodeError,
    NotEnoughStripesError,
    StripeFile,
    decode_path,
    encode_path,
    parse_code,
    stripe_size,
)

codes = st.builds(Code, k=st.integers(2, 10), m=st.integers(1, 4))
# 0, 1, and sizes that k does not divide; segment boundaries are covered by their own test.
sizes = st.one_of(st.sampled_from([0, 1, 2, 3, 7]), st.integers(0, 200_000))


def _crc(data: bytes) -> str:
    return f"{crc32c.crc32c(data):08x}"


def _stripes(code: Code, data: bytes, folder: Path) -> list[StripeFile]:
    src = folder / "file"
    src.write_bytes(data)
    dests = [folder / f"stripe.{i}" for i in range(code.width)]
    infos = encode_path(code, src, dests)
    assert [i.index for i in infos] == list(range(code.width))
    for info, dest in zip(infos, dests, strict=True):
        assert dest.stat().st_size == info.size == stripe_size(code, len(data))
        assert _crc(dest.read_bytes()) == info.crc32c
    return [StripeFile(i.index, d, i.crc32c) for i, d in zip(infos, dests, strict=True)]


@settings(max_examples=60, deadline=None)
@given(code=codes, size=sizes, data=st.data())
def test_any_k_stripes_decode_to_the_file(code: Code, size: int, data: st.DataObject) -> None:
    payload = random.Random(size).randbytes(size)
    chosen = data.draw(st.permutations(range(code.width))).copy()[: code.k]
    with tempfile.TemporaryDirectory() as d:
        stripes = _stripes(code, payload, Path(d))
        out = Path(d) / "restored"
        got = decode_path(code, size, _crc(payload), [stripes[i] for i in chosen], out)
        assert sorted(got.used) == sorted(chosen) and not got.rejected
        assert out.read_bytes() == payload


@settings(max_examples=60, deadline=None)
@given(code=codes, size=sizes.filter(lambda n: n > 0), data=st.data())  # an empty file: no bytes
def test_a_stripe_with_a_flipped_byte_is_never_used(
    code: Code, size: int, data: st.DataObject
) -> None:
    payload = random.Random(size).randbytes(size)
    # A data stripe: the decode reads data stripes first, so this one would be used.
    bad = data.draw(st.integers(0, code.k - 1))
    with tempfile.TemporaryDirectory() as d:
        stripes = _stripes(code, payload, Path(d))
        raw = bytearray(stripes[bad].path.read_bytes())
        at = data.draw(st.integers(0, len(raw) - 1))
        raw[at] ^= 1 << data.draw(st.integers(0, 7))
        stripes[bad].path.write_bytes(raw)
        out = Path(d) / "restored"

        got = decode_path(code, size, _crc(payload), stripes, out)
        assert bad in got.rejected and bad not in got.used
        assert out.read_bytes() == payload

        out.unlink()
        others = [s for s in stripes if s.index != bad][: code.k - 1]
        with pytest.raises(NotEnoughStripesError):
            decode_path(code, size, _crc(payload), [stripes[bad], *others], out)
        assert not out.exists()
        assert sorted(p.name for p in Path(d).iterdir() if p.name.startswith(".")) == []


@pytest.mark.parametrize(
    "size", [SEGMENT_BYTES - 1, SEGMENT_BYTES, SEGMENT_BYTES + 3, 2 * SEGMENT_BYTES + 11]
)
def test_files_across_segment_boundaries_decode_from_parity(size: int, tmp_path: Path) -> None:
    code = Code(4, 2)
    payload = random.Random(size).randbytes(size)
    stripes = _stripes(code, payload, tmp_path)
    out = tmp_path / "restored"
    got = decode_path(code, size, _crc(payload), stripes[2:], out)  # two data stripes lost
    assert got.used == [2, 3, 4, 5]
    assert out.read_bytes() == payload


def test_a_stripe_of_the_wrong_length_is_rejected(tmp_path: Path) -> None:
    code = Code(3, 1)
    payload = random.Random(1).randbytes(100_000)
    stripes = _stripes(code, payload, tmp_path)
    with stripes[0].path.open("ab") as f:
        f.write(b"x")
    got = decode_path(code, len(payload), _crc(payload), stripes, tmp_path / "out")
    assert list(got.rejected) == [0] and "longer" in got.rejected[0]
    stripes[1].path.write_bytes(stripes[1].path.read_bytes()[:-1])
    with pytest.raises(NotEnoughStripesError):
        decode_path(code, len(payload), _crc(payload), stripes, tmp_path / "out2")
    assert not (tmp_path / "out2").exists()


def test_a_decode_that_does_not_match_the_registered_crc_publishes_nothing(
    tmp_path: Path,
) -> None:
    code = Code(2, 1)
    payload = b"checkpoint bytes" * 1000
    stripes = _stripes(code, payload, tmp_path)
    with pytest.raises(FileMismatchError):
        decode_path(code, len(payload), _crc(payload + b"!"), stripes, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("rs(8,2)", Code(8, 2)),
        (" rs( 4 , 2 ) ", Code(4, 2)),
        ("rs(2,1)", Code(2, 1)),
        ("rs(30,2)", Code(30, 2)),
    ],
)
def test_codes_parse(text: str, code: Code) -> None:
    assert parse_code(text) == code
    assert parse_code(str(code)) == code


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("rs(1,2)", "k must be at least 2"),
        ("rs(4,0)", "m must be at least 1"),
        ("rs(30,3)", "at most 32"),
        ("rs(8)", "not of the form rs(k,m)"),
        ("xor(4,1)", "not of the form rs(k,m)"),
        ("rs(-1,2)", "not of the form rs(k,m)"),
        ("", "not of the form rs(k,m)"),
    ],
)
def test_bad_codes_say_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(InvalidCodeError, match=re.escape(says)):
        parse_code(text)
