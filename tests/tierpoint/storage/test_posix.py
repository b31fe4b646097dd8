from __future__ import annotations

import fcntl
import io
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.properties import examples
from tests.helpers.storage import (
    InterruptedSource,
    MiB,
    Progress,
    new_ref,
    random_bytes,
    recorded,
)
from tierpoint.errors import UnsafePath
from tierpoint.storage.base import RecordedCopy, ResumeState, ShardRef, SourceSizeMismatch
from tierpoint.storage.checksum import crc32c_hex, crc32c_of
from tierpoint.storage.paths import PARTIAL_SUFFIX, partial_name
from tierpoint.storage.posix.store import PosixStore
from tierpoint.storage.registry import open_store
from tierpoint.tier_config import TierConfig, TierKind


def partials(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.endswith(PARTIAL_SUFFIX)]


@pytest.mark.parametrize("size", [0, 1, 256 * 1024, 3 * MiB + 17])
def test_round_trip(posix_store: PosixStore, size: int) -> None:
    data = random_bytes(size)
    ref = new_ref("deep/dir/shard.bin")
    progress = Progress()
    result = posix_store.write(ref, io.BytesIO(data), size, None, progress)
    assert result.size == size
    assert result.crc32c == crc32c_hex(crc32c_of(data))
    location = posix_store.location(ref)
    assert location == str(posix_store.root / ref.job / "100" / "deep/dir/shard.bin")
    assert Path(location).read_bytes() == data
    assert posix_store.size(ref) == size
    assert progress.last == ResumeState(offset=size, crc=crc32c_of(data))
    with posix_store.open_read(ref, offset=size // 2) as f:
        assert f.read() == data[size // 2 :]
    assert posix_store.verify(ref, size, result.crc32c).ok
    sealed = posix_store.checksum(ref)
    assert (sealed.ok, sealed.size, sealed.crc32c) == (True, size, result.crc32c)
    assert partials(posix_store.root) == []


def test_copy_between_two_posix_tiers(tmp_path: Path) -> None:
    ssd = open_store(
        TierConfig(name="ssd", kind=TierKind.LOCAL, root=str(tmp_path / "n" / "{node}")), "node-a"
    )
    assert isinstance(ssd, PosixStore) and ssd.root == tmp_path / "n" / "node-a"
    lustre = open_store(TierConfig(name="l", kind=TierKind.SHARED, root=str(tmp_path / "l")), None)
    data = random_bytes(2 * MiB + 3)
    ref = new_ref()
    src = ssd.write(ref, io.BytesIO(data), len(data), None, None)
    with ssd.open_read(ref) as f:
        dst = lustre.write(ref, f, len(data), None, None)
    assert (src.size, src.crc32c) == (dst.size, dst.crc32c)
    assert src.identity != dst.identity  # two files
    assert Path(lustre.location(ref)).read_bytes() == data


def test_local_tier_needs_a_node(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        open_store(TierConfig(name="ssd", kind=TierKind.LOCAL, root=str(tmp_path / "{node}")), None)


def test_interrupted_copy_leaves_no_final_file_and_resumes(posix_store: PosixStore) -> None:
    data = random_bytes(5 * MiB + 123)
    ref = new_ref()
    progress = Progress()
    with pytest.raises(OSError, match="went away"):
        posix_store.write(
            ref, InterruptedSource(data, fail_after=3 * MiB + 5), len(data), None, progress
        )
    assert posix_store.size(ref) is None
    assert not Path(posix_store.location(ref)).exists()
    assert len(partials(posix_store.root)) == 1
    state = progress.last
    assert 0 < state.offset <= 3 * MiB
    assert state.crc == crc32c_of(data[: state.offset])

    source = InterruptedSource(data, start=state.offset)
    resumed = Progress()
    result = posix_store.write(ref, source, len(data), state, resumed)
    # It went on from the reported offset: no seek back, first read where the caller put it.
    assert source.first_read_at == state.offset and source.seeks == []
    assert resumed.states[0].offset > state.offset
    assert result.crc32c == crc32c_hex(crc32c_of(data))
    assert Path(posix_store.location(ref)).read_bytes() == data
    assert posix_store.verify(ref, len(data), result.crc32c).ok
    assert partials(posix_store.root) == []


def test_resume_without_the_temp_file_starts_over(posix_store: PosixStore) -> None:
    data = random_bytes(2 * MiB)
    ref = new_ref()
    progress = Progress()
    with pytest.raises(OSError):
        posix_store.write(ref, InterruptedSource(data, fail_after=MiB), len(data), None, progress)
    posix_store.cleanup_partial(ref, progress.last)
    assert partials(posix_store.root) == []
    source = InterruptedSource(data, start=progress.last.offset)
    result = posix_store.write(ref, source, len(data), progress.last, None)
    assert source.seeks == [0] and source.first_read_at == 0
    assert result.crc32c == crc32c_hex(crc32c_of(data))
    assert Path(posix_store.location(ref)).read_bytes() == data


def test_resume_state_beyond_the_temp_file_starts_over(posix_store: PosixStore) -> None:
    data = random_bytes(MiB)
    ref = new_ref()
    entry = Path(posix_store.location(ref))
    entry.parent.mkdir(parents=True)
    (entry.parent / partial_name(entry.name)).write_bytes(data[:1000])
    source = InterruptedSource(data, start=4096)
    result = posix_store.write(ref, source, len(data), ResumeState(offset=4096, crc=1), None)
    assert source.seeks == [0]
    assert result.crc32c == crc32c_hex(crc32c_of(data))
    assert entry.read_bytes() == data


@pytest.mark.parametrize("actual", [99, 101])
def test_source_of_the_wrong_size_is_refused(posix_store: PosixStore, actual: int) -> None:
    ref = new_ref()
    with pytest.raises(SourceSizeMismatch):
        posix_store.write(ref, io.BytesIO(b"x" * actual), 100, None, None)
    assert posix_store.size(ref) is None


def test_rewrite_replaces_atomically(posix_store: PosixStore) -> None:
    ref = new_ref()
    posix_store.write(ref, io.BytesIO(b"old contents"), 12, None, None)
    posix_store.write(ref, io.BytesIO(b"new"), 3, None, None)
    assert Path(posix_store.location(ref)).read_bytes() == b"new"


def test_verify_detects_a_flipped_byte_on_disk(posix_store: PosixStore) -> None:
    data = random_bytes(MiB + 7)
    ref = new_ref()
    result = posix_store.write(ref, io.BytesIO(data), len(data), None, None)
    path = posix_store.location(ref)
    with open(path, "r+b") as f:
        f.seek(4242)
        byte = f.read(1)
        f.seek(4242)
        f.write(bytes([byte[0] ^ 0x01]))
    check = posix_store.verify(ref, len(data), result.crc32c)
    assert not check.ok
    assert check.reason is not None and check.reason.startswith("crc32c ")
    assert check.crc32c != result.crc32c and check.size == len(data)
    sealed = posix_store.checksum(ref)
    assert sealed.crc32c == check.crc32c


@pytest.mark.parametrize(
    ("size", "flip"),
    [
        (1024 * 1024, 1024 * 1024 - 1),  # a whole number of buffers: the last byte
        (1024 * 1024 + 17, 1024 * 1024 + 16),  # the short tail past the last full buffer
        (3 * 256 * 1024 + 5, 256 * 1024),  # the first byte of the read that was in flight
        (256 * 1024, 0),
        (1, 0),
    ],
)
def test_read_back_covers_every_byte_of_the_file(
    posix_store: PosixStore, size: int, flip: int
) -> None:
    """The read-back keeps reads in flight ahead of the one being checksummed and ends at a
    short read: whatever the alignment of the size, a wrong byte anywhere is seen."""
    data = random_bytes(size)
    ref = new_ref()
    result = posix_store.write(ref, io.BytesIO(data), size, None, None)
    assert posix_store.verify(ref, size, result.crc32c).ok
    with open(posix_store.location(ref), "r+b") as f:
        f.seek(flip)
        f.write(bytes([data[flip] ^ 0x80]))
    check = posix_store.verify(ref, size, result.crc32c)
    assert not check.ok and check.size == size
    bad = data[:flip] + bytes([data[flip] ^ 0x80]) + data[flip + 1 :]
    assert check.crc32c == crc32c_hex(crc32c_of(bad))


def test_verify_reports_missing_and_wrong_size(posix_store: PosixStore) -> None:
    ref = new_ref()
    assert posix_store.verify(ref, 3, "00000000").reason == "missing"
    assert posix_store.checksum(ref).reason == "missing"
    r = posix_store.write(ref, io.BytesIO(b"abc"), 3, None, None)
    bad = posix_store.verify(ref, 4, r.crc32c)
    assert not bad.ok and bad.reason == "size 3 != 4"
    with pytest.raises(ValueError):
        posix_store.verify(ref, 3, "xyz")


def test_delete_is_idempotent_and_prunes_empty_directories(posix_store: PosixStore) -> None:
    ref = new_ref("a/b/c.bin")
    other = ShardRef(ref.job, ref.step, "a/keep.bin")
    written = posix_store.write(ref, io.BytesIO(b"1"), 1, None, None).identity
    kept = posix_store.write(other, io.BytesIO(b"2"), 1, None, None).identity
    posix_store.delete(ref, written)
    posix_store.delete(ref, written)
    assert posix_store.size(ref) is None
    assert not (posix_store.root / ref.job / "100" / "a" / "b").exists()
    assert posix_store.size(other) == 1
    posix_store.delete(other, kept)
    assert list(posix_store.root.iterdir()) == []
    assert posix_store.root.is_dir()


def test_delete_checkpoint_is_idempotent(posix_store: PosixStore) -> None:
    ref = new_ref("x/y.bin")
    keep = ShardRef(ref.job, ref.step + 1, "y.bin")
    for r in (ref, ShardRef(ref.job, ref.step, "z"), keep):
        posix_store.write(r, io.BytesIO(b"data"), 4, None, None)
    # An abandoned temp file goes with its checkpoint.
    with pytest.raises(OSError):
        posix_store.write(
            ShardRef(ref.job, ref.step, "w"),
            InterruptedSource(b"q" * MiB, fail_after=10),
            MiB,
            None,
            None,
        )
    registered = recorded(posix_store, ref.job, ref.step, ["x/y.bin", "z", "w"])
    posix_store.delete_checkpoint(ref.job, ref.step, registered)
    posix_store.delete_checkpoint(ref.job, ref.step, registered)
    assert not (posix_store.root / ref.job / str(ref.step)).exists()
    assert posix_store.size(keep) == 4
    posix_store.delete_checkpoint(
        keep.job, keep.step, recorded(posix_store, keep.job, keep.step, ["y.bin"])
    )
    assert list(posix_store.root.iterdir()) == []
    posix_store.delete_checkpoint("never-there", 5, [RecordedCopy("a")])


def test_delete_checkpoint_does_not_follow_symlinks_inside(
    posix_store: PosixStore, tmp_path: Path
) -> None:
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "file").write_bytes(b"keep me")
    ref = new_ref()
    posix_store.write(ref, io.BytesIO(b"x"), 1, None, None)
    (posix_store.root / ref.job / str(ref.step) / "link").symlink_to(outside)
    # Nothing is deleted through a symlink, even under a registered name.
    copies = recorded(posix_store, ref.job, ref.step, [ref.path])
    with pytest.raises(UnsafePath):
        posix_store.delete_checkpoint(ref.job, ref.step, [*copies, RecordedCopy("link/file")])
    assert (outside / "file").read_bytes() == b"keep me"
    report = posix_store.delete_checkpoint(ref.job, ref.step, copies)
    assert report.left == ("link",)


def test_cleanup_partial_is_idempotent(posix_store: PosixStore) -> None:
    ref = new_ref()
    progress = Progress()
    with pytest.raises(OSError):
        posix_store.write(
            ref, InterruptedSource(b"a" * MiB, fail_after=MiB // 2), MiB, None, progress
        )
    assert len(partials(posix_store.root)) == 1
    posix_store.cleanup_partial(ref, progress.last)
    posix_store.cleanup_partial(ref, progress.last)
    posix_store.cleanup_partial(new_ref(), None)
    assert partials(posix_store.root) == []
    assert posix_store.size(ref) is None


def test_long_names_get_a_short_temp_name(posix_store: PosixStore) -> None:
    name = "n" * 250
    ref = new_ref(name)
    assert len(partial_name(name)) < 255
    progress = Progress()
    with pytest.raises(OSError):
        posix_store.write(
            ref, InterruptedSource(b"a" * MiB, fail_after=700 * 1024), MiB, None, progress
        )
    result = posix_store.write(
        ref, InterruptedSource(b"a" * MiB, start=progress.last.offset), MiB, progress.last, None
    )
    assert result.crc32c == crc32c_hex(crc32c_of(b"a" * MiB))
    assert os.path.getsize(posix_store.location(ref)) == MiB


def test_a_second_writer_of_the_same_shard_is_turned_away(posix_store: PosixStore) -> None:
    data = random_bytes(MiB)
    ref = new_ref()
    progress = Progress()
    with pytest.raises(OSError, match="went away"):
        posix_store.write(ref, InterruptedSource(data, fail_after=MiB // 2), MiB, None, progress)
    (tmp,) = partials(posix_store.root)
    # Another attempt at this shard still holds its temp file.
    other = os.open(tmp, os.O_WRONLY)
    try:
        fcntl.flock(other, fcntl.LOCK_EX)
        with pytest.raises(BlockingIOError):
            posix_store.write(ref, io.BytesIO(data), MiB, None, None)
        assert posix_store.size(ref) is None
        assert tmp.stat().st_size > 0  # its bytes were left alone
    finally:
        os.close(other)
    result = posix_store.write(
        ref, InterruptedSource(data, start=progress.last.offset), MiB, progress.last, None
    )
    assert result.crc32c == crc32c_hex(crc32c_of(data))
    assert Path(posix_store.location(ref)).read_bytes() == data


@settings(
    max_examples=examples(25),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    size=st.integers(min_value=1, max_value=600_000),
    cuts=st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=1, max_size=3),
)
def test_any_sequence_of_interruptions_ends_with_the_right_bytes(
    tmp_path: Path, size: int, cuts: list[float]
) -> None:
    store = PosixStore(
        TierConfig(name="l", kind=TierKind.SHARED, root=str(tmp_path / "root")), buffer_size=65536
    )
    data = random_bytes(size)
    ref = new_ref()
    state: ResumeState | None = None
    for cut in cuts:
        start = state.offset if state else 0
        progress = Progress()
        with pytest.raises(OSError):
            store.write(
                ref,
                InterruptedSource(data, start=start, fail_after=int(cut * (size - start))),
                size,
                state,
                progress,
            )
        assert store.size(ref) is None
        if progress.states:
            state = progress.last
            assert state.crc == crc32c_of(data[: state.offset])
    start = state.offset if state else 0
    result = store.write(ref, InterruptedSource(data, start=start), size, state, None)
    assert result.crc32c == crc32c_hex(crc32c_of(data))
    assert Path(store.location(ref)).read_bytes() == data
    store.delete_checkpoint(ref.job, ref.step, recorded(store, ref.job, ref.step, [ref.path]))


def test_a_thread_copying_small_shards_holds_buffers_of_their_size(
    posix_store: PosixStore, tmp_path: Path
) -> None:
    """A worker serving many nodes copies on many threads; each keeps its copy and read-back
    buffers for the next shard. For shards far below the chunk size they must stay that small:
    8 MiB buffers on 64 threads were gigabytes of memory never filled."""
    from concurrent.futures import ThreadPoolExecutor

    from tierpoint.storage.posix import streams

    size = 16 * 1024
    data = random_bytes(size)

    def copy_and_verify() -> list[int]:
        ref = new_ref("small.bin")
        src = tmp_path / "src.bin"
        src.write_bytes(data)
        with open(src, "rb") as f:
            result = posix_store.write(ref, f, size, None, None)
        assert posix_store.verify(ref, size, result.crc32c).ok
        return [len(b) for b in (*streams._cache.copy, *streams._cache.direct)]

    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(copy_and_verify).result()
    assert held and all(n <= size + 4096 for n in held), held
