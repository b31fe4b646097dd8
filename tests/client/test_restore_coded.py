"""The client's restore of a coded peer copy (a plan entry with `code` and `stripes`): the file
decoded from k stripes read over HTTP from the holders, a rotten stripe read around; with fewer
than k good stripes (holders gone since the plan was made) the copy is given up like any other
and the next tier's copy restores the file, and without one nothing is written."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import crc32c
import pytest
from tierpoint_client.erasure import Code, encode_path
from tierpoint_client.errors import NoVerifiedCopyError
from tierpoint_client.models import PlanEntry, PlanStripe
from tierpoint_client.restore import restore_plan

from apps.devstack.services import free_port
from tests.helpers.client import file_server

CODE = Code(2, 1)
SIZE = 4 * 1024 * 1024 + 777  # two segments, the last one short
PATH = "rank-0/shard-00000.bin"


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """An HTTP server standing in for the holders' data endpoints: it serves `served/`."""
    served = tmp_path / "served"
    served.mkdir()
    with file_server(served) as base:
        yield served, base


def _coded_entry(tmp_path: Path, served: Path, bases: list[str]) -> tuple[bytes, PlanEntry]:
    """A file cut into rs(2,1) stripes under `served`, and its plan entry with stripe i read at
    `bases[i]`."""
    data = random.Random(11).randbytes(SIZE)
    src = tmp_path / "original"
    src.write_bytes(data)
    infos = encode_path(CODE, src, [served / f"s{i}" for i in range(CODE.width)])
    stripes = tuple(
        PlanStripe(i.index, f"node-{i.index}", f"{bases[i.index]}/s{i.index}", i.size, i.crc32c)
        for i in infos
    )
    crc = f"{crc32c.crc32c(data):08x}"
    where = f"{CODE} stripes on {len(stripes)} holders"
    entry = PlanEntry(
        PATH, SIZE, crc, "coded", "peer", None, where, code=str(CODE), stripes=stripes
    )
    return data, entry


def test_a_coded_copy_is_decoded_from_its_holders_a_rotten_stripe_read_around(
    holder: tuple[Path, str], tmp_path: Path
) -> None:
    served, base = holder
    data, entry = _coded_entry(tmp_path, served, [base] * CODE.width)
    first = served / "s0"
    rotten = first.read_bytes()
    first.write_bytes(rotten[:100] + bytes([rotten[100] ^ 0x01]) + rotten[101:])
    done = restore_plan([entry], tmp_path / "dest", {}, token="t")
    assert (tmp_path / "dest" / PATH).read_bytes() == data
    assert [f.crc32c for f in done.files] == [entry.crc32c]


def test_fewer_than_k_holders_falls_back_to_the_next_tier_or_writes_nothing(
    holder: tuple[Path, str], tmp_path: Path
) -> None:
    served, base = holder
    gone = f"http://127.0.0.1:{free_port()}"  # nothing listens: a holder down
    data, entry = _coded_entry(tmp_path, served, [gone, gone, base])
    shared = tmp_path / "lustre" / PATH
    shared.parent.mkdir(parents=True)
    shared.write_bytes(data)
    next_tier = PlanEntry(PATH, SIZE, entry.crc32c, "lustre", "shared", None, str(shared))
    asked: list[str] = []

    def fallback(e: PlanEntry, err: Exception, tried: frozenset[str]) -> PlanEntry | None:
        asked.append(e.tier)
        return next_tier if "lustre" not in tried else None

    done = restore_plan([entry], tmp_path / "dest", {}, fallback=fallback, token="t")
    assert asked == ["coded"]
    assert [f.tier for f in done.files] == ["lustre"]
    assert (tmp_path / "dest" / PATH).read_bytes() == data

    with pytest.raises(NoVerifiedCopyError, match="coded"):
        restore_plan([entry], tmp_path / "empty", {}, token="t")
    assert not (tmp_path / "empty").exists() or list((tmp_path / "empty").rglob("*")) == []
