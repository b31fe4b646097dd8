"""A coded copy as TierpointReader's source reads it (`sources.coded_read.CodedSource`), its
stripes served over HTTP by several holders (rs(4,2)): with every data stripe there the file is
joined from them; a data stripe gone is made up from parity, and a parity stripe cut off in
transit then is read around too, each with a warning; with more than m gone the copy is one that
cannot be read (SourceError), and nothing decoded from a bad stripe is handed on."""

from __future__ import annotations

import random
import warnings
from pathlib import Path

import crc32c
import pytest
from tierpoint_client.erasure import Code, encode_path
from tierpoint_client.errors import SourceError
from tierpoint_client.models import PlanEntry, PlanStripe
from tierpoint_client.sources import Sources
from tierpoint_client.sources.coded_read import CodedSource

from tests.client.test_erasure_fetch import holders  # noqa: F401  (the holders' server)

CODE = Code(4, 2)
SIZE = 9 * 1024 * 1024 + 12345  # three segments, the last one short


def _entry(served: Path, base: str, cut: tuple[int, ...] = ()) -> tuple[bytes, PlanEntry]:
    data = random.Random(11).randbytes(SIZE)
    src = served.parent / "original"
    src.write_bytes(data)
    infos = encode_path(CODE, src, [served / f"s{i}" for i in range(CODE.width)])
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
        code=str(CODE),
        stripes=stripes,
    )
    return data, entry


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
