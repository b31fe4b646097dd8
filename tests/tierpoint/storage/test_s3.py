from __future__ import annotations

import io
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.s3_endpoints import S3Endpoint
from tests.helpers.storage import InterruptedSource, MiB, Progress, new_ref, random_bytes
from tierpoint.storage.base import RecordedCopy, ResumeState, ShardRef, SourceSizeMismatch
from tierpoint.storage.checksum import crc32c_hex, crc32c_of, crc32c_to_base64
from tierpoint.storage.posix.store import PosixStore
from tierpoint.storage.registry import open_store
from tierpoint.storage.s3.layout import FLAT
from tierpoint.storage.s3.multipart import part_size_for
from tierpoint.storage.s3.store import S3Store
from tierpoint.tier_config import TierConfig, TierKind


def object_bytes(raw_s3: Any, store: S3Store, ref: ShardRef) -> bytes:
    data: bytes = raw_s3.get_object(Bucket=store.bucket, Key=store.key(ref))["Body"].read()
    return data


def uploads(raw_s3: Any, store: S3Store) -> list[str]:
    return [
        u["UploadId"] for u in raw_s3.list_multipart_uploads(Bucket=store.bucket).get("Uploads", [])
    ]


@pytest.mark.parametrize("size", [0, 1, 5 * MiB, 5 * MiB + 1, 17 * MiB + 5])
def test_round_trip(s3_store: S3Store, raw_s3: Any, s3_endpoint: S3Endpoint, size: int) -> None:
    data = random_bytes(size)
    ref = new_ref("dir/shard.bin")
    result = s3_store.write(ref, io.BytesIO(data), size, None, Progress())
    assert result.size == size
    assert result.crc32c == crc32c_hex(crc32c_of(data))
    assert s3_store.location(ref) == f"s3://{s3_store.bucket}/ckpt/{ref.job}/100/dir/shard.bin"
    assert object_bytes(raw_s3, s3_store, ref) == data
    assert s3_store.size(ref) == size
    head = raw_s3.head_object(Bucket=s3_store.bucket, Key=s3_store.key(ref), ChecksumMode="ENABLED")
    if s3_endpoint.stores_checksums:
        # S3 holds the whole-object CRC32C: verification compares it without reading the bytes.
        assert head["ChecksumCRC32C"] == crc32c_to_base64(crc32c_of(data))
        if size > 5 * MiB:
            assert head["ChecksumType"] == "FULL_OBJECT"
    else:
        # RGW 16.2 stored no checksum (and answered the completion with an empty ETag): the
        # verification below reads the object back instead.
        assert "ChecksumCRC32C" not in head
    check = s3_store.verify(ref, size, result.crc32c)
    assert check.ok and check.crc32c == result.crc32c
    sealed = s3_store.checksum(ref)
    assert (sealed.size, sealed.crc32c) == (size, result.crc32c)
    with s3_store.open_read(ref, offset=size // 3) as f:
        assert f.read() == data[size // 3 :]
    assert uploads(raw_s3, s3_store) == []


def test_multipart_reports_contiguous_prefixes_with_the_upload(
    s3_store: S3Store, s3_endpoint: S3Endpoint
) -> None:
    data = random_bytes(16 * MiB + 1)
    progress = Progress()
    s3_store.write(new_ref(), io.BytesIO(data), len(data), None, progress)
    upload_ids = {s.upload_id for s in progress.states}
    assert len(upload_ids) == 1 and None not in upload_ids
    offsets = [s.offset for s in progress.states]
    assert offsets == sorted(offsets) and offsets[0] == 0 and offsets[-1] == len(data)
    # RGW 16.2 answers CreateMultipartUpload without a ChecksumType: a COMPOSITE upload, whose
    # completion then carries no whole-object checksum (verification reads it back).
    kind = "FULL_OBJECT" if s3_endpoint.stores_checksums else "COMPOSITE"
    for s in progress.states:
        assert s.crc == crc32c_of(data[: s.offset])
        assert s.extra["part_size"] == 5 * MiB and s.extra["checksum_type"] == kind


def test_interrupted_upload_resumes_on_the_same_upload(s3_store: S3Store, raw_s3: Any) -> None:
    data = random_bytes(23 * MiB + 11)
    ref = new_ref()
    progress = Progress()
    with pytest.raises(OSError, match="went away"):
        s3_store.write(ref, InterruptedSource(data, fail_after=16 * MiB), len(data), None, progress)
    # Nothing under the key: an unfinished multipart upload is invisible.
    assert s3_store.size(ref) is None
    state = progress.last
    assert state.upload_id in uploads(raw_s3, s3_store)
    assert state.offset in (5 * MiB, 10 * MiB, 15 * MiB)
    assert state.crc == crc32c_of(data[: state.offset])

    # The state as it travels through Temporal heartbeat details: primitives only.
    state = ResumeState(**{k: v for k, v in vars(state).items()})
    source = InterruptedSource(data, start=state.offset)
    resumed = Progress()
    result = s3_store.write(ref, source, len(data), state, resumed)
    assert source.first_read_at == state.offset and source.seeks == []
    assert {s.upload_id for s in resumed.states} == {state.upload_id}
    assert resumed.states[0].offset == state.offset
    assert result.crc32c == crc32c_hex(crc32c_of(data))
    assert object_bytes(raw_s3, s3_store, ref) == data
    assert s3_store.verify(ref, len(data), result.crc32c).ok
    assert uploads(raw_s3, s3_store) == []


def test_resume_of_a_vanished_upload_starts_over(s3_store: S3Store, raw_s3: Any) -> None:
    data = random_bytes(12 * MiB)
    ref = new_ref()
    progress = Progress()
    with pytest.raises(OSError):
        s3_store.write(ref, InterruptedSource(data, fail_after=11 * MiB), len(data), None, progress)
    state = progress.last
    assert state.offset == 10 * MiB
    s3_store.cleanup_partial(ref, state)
    assert uploads(raw_s3, s3_store) == []
    source = InterruptedSource(data, start=state.offset)
    resumed = Progress()
    result = s3_store.write(ref, source, len(data), state, resumed)
    assert source.seeks == [0]
    assert resumed.states[0].upload_id != state.upload_id
    assert result.crc32c == crc32c_hex(crc32c_of(data))
    assert object_bytes(raw_s3, s3_store, ref) == data


def test_resume_claiming_more_than_s3_holds_starts_over(s3_store: S3Store, raw_s3: Any) -> None:
    data = random_bytes(12 * MiB)
    ref = new_ref()
    progress = Progress()
    with pytest.raises(OSError):
        s3_store.write(ref, InterruptedSource(data, fail_after=6 * MiB), len(data), None, progress)
    state = progress.last
    assert state.offset == 5 * MiB
    lying = ResumeState(offset=10 * MiB, crc=0, upload_id=state.upload_id, extra=state.extra)
    source = InterruptedSource(data, start=lying.offset)
    result = s3_store.write(ref, source, len(data), lying, None)
    assert source.seeks == [0]
    assert result.crc32c == crc32c_hex(crc32c_of(data))
    assert object_bytes(raw_s3, s3_store, ref) == data
    assert uploads(raw_s3, s3_store) == []


@pytest.mark.parametrize("actual", [6 * MiB, 7 * MiB + 1, 10, 12])
def test_source_of_the_wrong_size_is_refused(s3_store: S3Store, actual: int) -> None:
    expected = 7 * MiB if actual > 100 else 11
    ref = new_ref()
    with pytest.raises(SourceSizeMismatch):
        s3_store.write(ref, io.BytesIO(b"x" * actual), expected, None, None)
    assert s3_store.size(ref) is None


def test_verify_detects_a_different_object(
    s3_store: S3Store, raw_s3: Any, s3_endpoint: S3Endpoint
) -> None:
    data = random_bytes(6 * MiB)
    ref = new_ref()
    result = s3_store.write(ref, io.BytesIO(data), len(data), None, None)
    other = bytearray(data)
    other[12345] ^= 0xFF
    raw_s3.put_object(
        Bucket=s3_store.bucket,
        Key=s3_store.key(ref),
        Body=bytes(other),
        ChecksumAlgorithm="CRC32C",
        ChecksumCRC32C=crc32c_to_base64(crc32c_of(other)),
    )
    check = s3_store.verify(ref, len(data), result.crc32c)
    assert not check.ok and check.reason is not None
    # RGW stored no checksum to compare: the object is read back.
    how = "stored by S3" if s3_endpoint.stores_checksums else "read back"
    assert check.reason.startswith("crc32c ") and how in check.reason


def test_verify_reads_back_when_s3_has_no_crc32c(s3_store: S3Store, raw_s3: Any) -> None:
    data = random_bytes(3 * MiB)
    ref = new_ref()
    good = crc32c_hex(crc32c_of(data))
    # A plain upload: botocore's default CRC32, no CRC32C stored.
    raw_s3.put_object(Bucket=s3_store.bucket, Key=s3_store.key(ref), Body=data)
    assert s3_store.verify(ref, len(data), good).ok
    other = bytearray(data)
    other[-1] ^= 1
    raw_s3.put_object(Bucket=s3_store.bucket, Key=s3_store.key(ref), Body=bytes(other))
    check = s3_store.verify(ref, len(data), good)
    assert not check.ok and check.reason is not None and "read back" in check.reason


def test_verify_reports_missing_and_wrong_size(s3_store: S3Store) -> None:
    ref = new_ref()
    assert s3_store.verify(ref, 1, "00000000").reason == "missing"
    assert s3_store.checksum(ref).reason == "missing"
    r = s3_store.write(ref, io.BytesIO(b"abc"), 3, None, None)
    assert s3_store.verify(ref, 4, r.crc32c).reason == "size 3 != 4"


def test_delete_and_delete_checkpoint_are_idempotent(s3_store: S3Store, raw_s3: Any) -> None:
    ref = new_ref("a/b")
    sibling = ShardRef(ref.job, ref.step, "c")
    later = ShardRef(ref.job, ref.step + 1, "a/b")
    prefix_neighbour = ShardRef(ref.job, 10, "a/b")  # "100/" must not match "10/"
    for r in (ref, sibling, later, prefix_neighbour):
        s3_store.write(r, io.BytesIO(b"data"), 4, None, None)
    s3_store.delete(ref, None)
    s3_store.delete(ref, None)
    assert s3_store.size(ref) is None and s3_store.size(sibling) == 4
    progress = Progress()
    with pytest.raises(OSError):
        s3_store.write(
            ShardRef(ref.job, ref.step, "big"),
            InterruptedSource(b"z" * 11 * MiB, fail_after=6 * MiB),
            11 * MiB,
            None,
            progress,
        )
    assert uploads(raw_s3, s3_store) != []
    copies = [RecordedCopy(p) for p in ("a/b", "c", "big")]
    s3_store.delete_checkpoint(ref.job, ref.step, copies)
    s3_store.delete_checkpoint(ref.job, ref.step, copies)
    assert s3_store.size(sibling) is None
    assert uploads(raw_s3, s3_store) == []
    assert s3_store.size(later) == 4 and s3_store.size(prefix_neighbour) == 4


def test_cleanup_partial_aborts_abandoned_uploads(s3_store: S3Store, raw_s3: Any) -> None:
    ref = new_ref()
    data = b"q" * 11 * MiB
    first = Progress()
    with pytest.raises(OSError):
        s3_store.write(ref, InterruptedSource(data, fail_after=6 * MiB), len(data), None, first)
    # A second attempt that lost its heartbeat started another upload for the same key.
    with pytest.raises(OSError):
        s3_store.write(ref, InterruptedSource(data, fail_after=MiB), len(data), None, None)
    assert len(uploads(raw_s3, s3_store)) == 2
    s3_store.cleanup_partial(ref, first.last)
    s3_store.cleanup_partial(ref, first.last)
    assert uploads(raw_s3, s3_store) == []


def test_posix_to_s3_and_back(s3_tier: TierConfig, raw_s3: Any, tmp_path: Path) -> None:
    """The copy path both ways: local tier as source of an upload, S3 as source of a restore."""
    s3 = open_store(s3_tier, None, FLAT)
    assert isinstance(s3, S3Store)
    other = open_store(s3_tier.model_copy(update={"name": "s3-again"}), None)
    assert isinstance(other, S3Store) and other.client is s3.client  # one client per endpoint
    local = PosixStore(
        TierConfig(name="ssd", kind=TierKind.LOCAL, root=str(tmp_path / "{node}")), "n"
    )
    data = random_bytes(13 * MiB + 1)
    ref = new_ref()
    written = local.write(ref, io.BytesIO(data), len(data), None, None)
    with local.open_read(ref) as f:
        up = s3.write(ref, f, len(data), None, None)
    assert (up.size, up.crc32c) == (written.size, written.crc32c)
    assert up.identity is None  # an object has no file identity
    assert s3.verify(ref, len(data), up.crc32c).ok
    back = ShardRef(ref.job, ref.step + 1, ref.path)
    with s3.open_read(ref) as f:
        down = local.write(back, f, len(data), None, None)
    assert (down.size, down.crc32c) == (written.size, written.crc32c)
    assert Path(local.location(back)).read_bytes() == data


def test_part_size_fits_s3_limits(s3_tier: TierConfig) -> None:
    assert part_size_for(s3_tier, 1) == 5 * MiB
    big = 200 * 1024 * MiB
    part = part_size_for(s3_tier, big)
    assert part * 10_000 >= big and part % MiB == 0
    tiny = s3_tier.model_copy(update={"multipart_part_size": 1024})
    assert part_size_for(tiny, 10 * MiB) == 5 * MiB


def test_a_completed_write_cleans_up_uploads_of_lost_attempts(
    s3_store: S3Store, raw_s3: Any
) -> None:
    ref = new_ref()
    data = random_bytes(11 * MiB)
    for _ in range(2):  # two attempts died and their heartbeat state was lost
        with pytest.raises(OSError):
            s3_store.write(ref, InterruptedSource(data, fail_after=6 * MiB), len(data), None, None)
    assert len(uploads(raw_s3, s3_store)) == 2
    result = s3_store.write(ref, io.BytesIO(data), len(data), None, None)
    assert result.crc32c == crc32c_hex(crc32c_of(data))
    assert uploads(raw_s3, s3_store) == []


def test_verify_reads_back_a_composite_multipart_object(
    s3_store: S3Store, raw_s3: Any, s3_endpoint: S3Endpoint
) -> None:
    """Objects uploaded by other tools may carry a COMPOSITE checksum (a CRC of part CRCs),
    which is not comparable with the shard's crc32c: verification reads those back."""
    data = random_bytes(11 * MiB)
    ref = new_ref()
    key = s3_store.key(ref)
    up = raw_s3.create_multipart_upload(Bucket=s3_store.bucket, Key=key, ChecksumAlgorithm="CRC32C")
    parts = []
    for number, start in enumerate(range(0, len(data), 6 * MiB), start=1):
        chunk = data[start : start + 6 * MiB]
        crc = crc32c_to_base64(crc32c_of(chunk))
        r = raw_s3.upload_part(
            Bucket=s3_store.bucket,
            Key=key,
            UploadId=up["UploadId"],
            PartNumber=number,
            Body=chunk,
            ChecksumAlgorithm="CRC32C",
            ChecksumCRC32C=crc,
        )
        parts.append({"PartNumber": number, "ETag": r["ETag"], "ChecksumCRC32C": crc})
    raw_s3.complete_multipart_upload(
        Bucket=s3_store.bucket, Key=key, UploadId=up["UploadId"], MultipartUpload={"Parts": parts}
    )
    head = raw_s3.head_object(Bucket=s3_store.bucket, Key=key, ChecksumMode="ENABLED")
    assert head.get("ChecksumType") != "FULL_OBJECT"
    if s3_endpoint.stores_checksums:
        # Real S3 labels it ("<crc>-2", ChecksumType COMPOSITE); moto returns it unlabelled.
        assert head["ChecksumCRC32C"].split("-")[0] != crc32c_to_base64(crc32c_of(data))
    else:
        assert "ChecksumCRC32C" not in head  # RGW 16.2 keeps no checksum at all
    good = crc32c_hex(crc32c_of(data))
    check = s3_store.verify(ref, len(data), good)
    assert check.ok and check.crc32c == good
    bad = s3_store.verify(ref, len(data), crc32c_hex(crc32c_of(data) ^ 1))
    assert not bad.ok and bad.reason is not None and "read back" in bad.reason


def test_part_buffers_are_bounded_and_reused_without_leaking_bytes(
    s3_store: S3Store, raw_s3: Any
) -> None:
    """Uploads take at most concurrency + 1 part buffers and hand them to the next upload, whose
    object holds its own bytes only (its short last part is not padded with the previous one's)."""
    keep = s3_store.config.multipart_concurrency + 1
    pool = s3_store.uploads.buffers
    first, second = random_bytes(17 * MiB + 5), random_bytes(11 * MiB + 3)
    s3_store.write(new_ref("a.bin"), io.BytesIO(first), len(first), None, None)
    assert pool.idle() == keep
    idle = {id(b) for b in pool._idle[5 * MiB]}
    ref = new_ref("b.bin")
    result = s3_store.write(ref, io.BytesIO(second), len(second), None, None)
    assert {id(b) for b in pool._idle[5 * MiB]} == idle
    assert object_bytes(raw_s3, s3_store, ref) == second
    assert result.crc32c == crc32c_hex(crc32c_of(second))
    assert s3_store.verify(ref, len(second), result.crc32c).ok


def test_a_store_keeps_a_connection_for_every_thread_of_its_process(
    s3_tier: TierConfig, caplog: pytest.LogCaptureFixture
) -> None:
    """A process serving many nodes' queues runs more activity threads than the tier's own
    figures size the S3 client's pool for; a request beyond the pool would open a connection of
    its own and close it after (urllib3 says so: "Connection pool is full")."""
    threads = 48  # more than the tier's figures give: a pool of 32
    store = open_store(s3_tier, None, FLAT, threads=threads)
    assert isinstance(store, S3Store)
    barrier = threading.Barrier(threads, timeout=60)

    def put(i: int) -> None:
        data = random_bytes(1024)
        barrier.wait()  # every thread's request in flight at once
        store.write(new_ref(f"many/{i}.bin"), io.BytesIO(data), len(data), None, Progress())

    with (
        caplog.at_level(logging.WARNING, logger="urllib3.connectionpool"),
        ThreadPoolExecutor(threads) as pool,
    ):
        list(pool.map(put, range(threads * 3)))
    assert not [r for r in caplog.records if "pool is full" in r.getMessage()]
