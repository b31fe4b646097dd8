"""Restoring S3 and peer copies read off the socket into one buffer per worker: the exact bytes,
no new chunk allocated per read, a body cut off mid-way a read error (never a mismatch, which
would report a good copy corrupt), a longer copy or a bad crc32c falling back to the next copy,
and an S3 connection read to its end reused for the next object."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tierpoint_client import ChecksumMismatchError, NoVerifiedCopyError, PlanEntry, TierInfo
from tierpoint_client.hashing import CHUNK_SIZE
from tierpoint_client.restore import SourceError, restore_plan

from tests.client.test_restore_plan import _entry, _files_under, _posix_plan, s3_objects
from tests.helpers.client import QuietFiles, file_server
from tests.helpers.flip_proxy import flip_proxy
from tests.helpers.s3_proxy import Shaping, shaping_proxy
from tests.helpers.services import Services

MiB = 1024 * 1024


class Fallbacks:
    """A restore's fallback: records each failed copy (and whether it was a mismatch, which the
    client reports as corrupt) and offers the shard's copy in `others`."""

    def __init__(self, others: dict[str, PlanEntry] | None = None) -> None:
        self.others = others or {}
        self.calls: list[tuple[str, str]] = []
        self.mismatches: list[tuple[str, str]] = []

    def __call__(
        self, entry: PlanEntry, err: SourceError | ChecksumMismatchError, tried: frozenset[str]
    ) -> PlanEntry | None:
        self.calls.append((entry.tier, entry.path))
        if isinstance(err, ChecksumMismatchError):
            self.mismatches.append((entry.tier, entry.path))
        return self.others.get(entry.path)


def _behind(tiers: dict[str, TierInfo], url: str) -> dict[str, TierInfo]:
    return {"s3": dataclasses.replace(tiers["s3"], endpoint_url=url)}


def _hostport(url: str) -> str:
    return url.split("://", 1)[1].rstrip("/")


def test_large_s3_objects_land_exactly_their_bytes(tmp_path: Path, services: Services) -> None:
    shards = {
        "big.bin": os.urandom(33 * MiB + 7),
        "whole.bin": os.urandom(4 * CHUNK_SIZE),
        "one.bin": os.urandom(1),
        "empty.bin": b"",
    }
    objects = s3_objects(services, shards, "")
    files = restore_plan(objects.plan, tmp_path / "dest", objects.tiers, workers=2).files
    assert _files_under(tmp_path / "dest") == shards
    assert [(f.size, f.crc32c) for f in files] == [(e.size, e.crc32c) for e in objects.plan]


def test_an_object_with_a_content_encoding_is_read_through_botocores_body(
    tmp_path: Path, services: Services
) -> None:
    """Where urllib3 may decode the body, the socket is not read past it: the bytes still land
    as stored (whose crc32c was registered)."""
    data = os.urandom(9 * MiB + 1)
    objects = s3_objects(services, {"enc.bin": b""}, "")
    key = objects.prefix + "enc.bin"
    objects.s3.put_object(Bucket=objects.bucket, Key=key, Body=data, ContentEncoding="identity")
    entry = _entry("enc.bin", data, f"s3://{objects.bucket}/{key}", "s3", (objects.bucket, key))
    restore_plan([entry], tmp_path / "dest", objects.tiers)
    assert _files_under(tmp_path / "dest") == {"enc.bin": data}


def test_an_s3_restore_allocates_no_chunk_per_read(tmp_path: Path, services: Services) -> None:
    """The bytes go from the socket into the worker's one buffer: a read through urllib3 made a
    new object of a chunk's size for every chunk, then copied it."""
    shards = {"big.bin": os.urandom(6 * CHUNK_SIZE + 5)}
    objects = s3_objects(services, shards, "")
    # The first restore makes this thread's buffer and the process's client.
    restore_plan(objects.plan, tmp_path / "warm", objects.tiers, workers=1)
    tracemalloc.start()
    try:
        restore_plan(objects.plan, tmp_path / "dest", objects.tiers, workers=1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert _files_under(tmp_path / "dest") == shards
    assert peak < CHUNK_SIZE // 2, peak


def test_a_cut_s3_body_is_a_read_error_not_a_mismatch(tmp_path: Path, services: Services) -> None:
    """S3 (here a proxy) closes the connection half way through a body whose head promised all
    of it: the copy is unreadable, never a mismatch (which the client would report corrupt); the
    fallback is asked for another copy, and without one the restore fails saying why."""
    shards = {"big.bin": os.urandom(9 * MiB + 3)}
    objects = s3_objects(services, shards, "")
    fallback = Fallbacks()
    with flip_proxy(_hostport(services.s3_endpoint_url), -1, cut=True) as proxy:
        tiers = _behind(objects.tiers, proxy.url)
        with pytest.raises(NoVerifiedCopyError, match="cut off") as info:
            restore_plan(objects.plan, tmp_path / "dest", tiers, fallback=fallback)
        assert proxy.stats()["cut"] >= 1
    assert isinstance(info.value.__cause__, SourceError)
    assert fallback.calls == [("s3", "big.bin")]
    assert fallback.mismatches == []
    assert _files_under(tmp_path / "dest") == {}


@pytest.mark.parametrize("damage", ["longer", "flipped"])
def test_a_longer_or_damaged_s3_copy_falls_back_to_the_next(
    tmp_path: Path, services: Services, damage: str
) -> None:
    shards = {"a.bin": os.urandom(9 * MiB + 3), "b.bin": os.urandom(2 * MiB)}
    objects = s3_objects(services, shards, "")
    if damage == "longer":
        longer = shards["a.bin"] + os.urandom(CHUNK_SIZE)
        objects.s3.put_object(Bucket=objects.bucket, Key=objects.prefix + "a.bin", Body=longer)
    good = _posix_plan(tmp_path / "good", {"a.bin": shards["a.bin"]})[0]
    with contextlib.ExitStack() as stack:
        tiers = objects.tiers
        if damage == "flipped":
            proxy = stack.enter_context(flip_proxy(_hostport(services.s3_endpoint_url), 1))
            tiers = _behind(tiers, proxy.url)
        fallback = Fallbacks({"a.bin": good})
        files = restore_plan(objects.plan[:1], tmp_path / "dest", tiers, fallback=fallback).files
    assert fallback.calls == fallback.mismatches == [("s3", "a.bin")]
    assert [f.tier for f in files] == ["lustre"]
    assert _files_under(tmp_path / "dest") == {"a.bin": shards["a.bin"]}
    # Without another copy the mismatch is raised, and nothing is left.
    if damage == "longer":
        with pytest.raises(NoVerifiedCopyError, match="failed verification"):
            restore_plan(objects.plan, tmp_path / "dest2", objects.tiers, workers=2)
        assert _files_under(tmp_path / "dest2") == {}


def test_an_s3_connection_read_to_its_end_is_reused(tmp_path: Path, services: Services) -> None:
    """Counted by an S3 front that keeps connections, as S3 does (moto closes each): one worker
    restoring eight objects opens one connection; a stream left with bytes unread (a longer
    copy) is closed, and the next object opens a new one."""
    shards = {f"s{i}.bin": os.urandom(MiB + i) for i in range(8)}
    objects = s3_objects(services, shards, "")
    open_front = Shaping(0.0, 0.0, bandwidth=0, write_rate=0, read_rate=0, keep_alive=True)
    with shaping_proxy(services.s3_endpoint_url, open_front) as proxy:
        tiers = _behind(objects.tiers, proxy.endpoint_url)

        def opened(run: Callable[[], object]) -> int:
            before = int(proxy.stats()["connections"])
            run()
            return int(proxy.stats()["connections"]) - before - 1  # less the stats' own

        dest = tmp_path / "dest"
        assert opened(lambda: restore_plan(objects.plan, dest, tiers, workers=1)) == 1
        assert _files_under(dest) == shards
        # Longer by more than a chunk: the restore stops reading it with bytes still unread.
        longer = shards["s0.bin"] + os.urandom(2 * CHUNK_SIZE)
        objects.s3.put_object(Bucket=objects.bucket, Key=objects.prefix + "s0.bin", Body=longer)
        with pytest.raises(NoVerifiedCopyError, match="failed verification"):
            restore_plan(objects.plan[:1], tmp_path / "d2", tiers)
        assert (
            opened(lambda: restore_plan(objects.plan[1:], tmp_path / "d3", tiers, workers=1)) == 1
        )


class _Http11(QuietFiles):
    protocol_version = "HTTP/1.1"


@contextlib.contextmanager
def _file_server(root: Path) -> Iterator[str]:
    """A plain HTTP/1.1 file server (a peer's data endpoint as the client sees it): host:port."""
    with file_server(root, _Http11) as url:
        yield url.removeprefix("http://")


def _peer_entry(path: str, data: bytes, url: str) -> PlanEntry:
    entry = _entry(path, data, url, kind="peer")
    return dataclasses.replace(entry, tier="peer", url=url)


@pytest.mark.full_stack  # runs a proxy process
def test_a_cut_peer_body_is_a_read_error_not_a_mismatch(tmp_path: Path) -> None:
    data = os.urandom(9 * MiB + 3)
    served = tmp_path / "served"
    served.mkdir()
    (served / "p.bin").write_bytes(data)
    with _file_server(served) as endpoint:
        entry = _peer_entry("p.bin", data, f"http://{endpoint}/p.bin")
        restore_plan([entry], tmp_path / "whole", {})
        assert _files_under(tmp_path / "whole") == {"p.bin": data}
        fallback = Fallbacks()
        with flip_proxy(endpoint, -1, cut=True) as proxy:
            cut = dataclasses.replace(entry, url=f"{proxy.url}/p.bin")
            with pytest.raises(NoVerifiedCopyError, match="IncompleteRead"):
                restore_plan([cut], tmp_path / "dest", {}, fallback=fallback)
            assert proxy.stats()["cut"] == 1
    assert fallback.calls == [("peer", "p.bin")]
    assert fallback.mismatches == []
    assert _files_under(tmp_path / "dest") == {}
