"""We delete only what we registered: a store's deletion of a checkpoint removes the shards it is
named and its own temp files, leaves every other file or object where it is (and names it), and
removes a directory only once it is empty. And of a shard, only the file the catalog verified: a
file written at its path since is kept and reported. Each POSIX test runs with the kernel
resolving paths (openat2) and with the component-by-component fallback."""

from __future__ import annotations

import io
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.storage import InterruptedSource, MiB, new_ref, recorded
from tierpoint.storage.base import RecordedCopy, ShardRef
from tierpoint.storage.paths import aside_name, partial_name
from tierpoint.storage.posix.confined import OPENAT2
from tierpoint.storage.posix.store import PosixStore
from tierpoint.storage.s3.store import S3Store
from tierpoint.tier_config import TierConfig, TierKind

RESOLVERS = [
    pytest.param(
        True,
        id="openat2",
        marks=pytest.mark.skipif(not OPENAT2, reason="this kernel has no openat2"),
    ),
    pytest.param(False, id="nofollow-walk"),
]

OPTIMIZER = b"optimizer state nobody registered"


@pytest.fixture(params=RESOLVERS)
def store(request: pytest.FixtureRequest, shared_root: Path) -> PosixStore:
    tier = TierConfig(name="lustre", kind=TierKind.SHARED, root=str(shared_root))
    return PosixStore(tier, buffer_size=256 * 1024, openat2=request.param)


def _interrupted_write(store: PosixStore | S3Store, ref: ShardRef, size: int) -> None:
    """Leave what a copy that died half-way leaves: a temp file, or a multipart upload."""
    with pytest.raises(OSError, match="went away"):
        store.write(ref, InterruptedSource(b"p" * size, fail_after=size // 2), size, None, None)


def test_posix_deletes_only_the_registered_files_and_our_temp_files(store: PosixStore) -> None:
    ref = new_ref("a.bin")
    nested = ShardRef(ref.job, ref.step, "model/r0.bin")
    died = ShardRef(ref.job, ref.step, "model/r1.bin")
    for r in (ref, nested):
        store.write(r, io.BytesIO(b"shard"), 5, None, None)
    _interrupted_write(store, died, MiB)
    step_dir = store.root / ref.job / str(ref.step)
    assert (step_dir / "model" / partial_name("r1.bin")).is_file()
    # What the job wrote beside its shards without registering it, and a temp-looking file of
    # a name nobody registered: neither is ours.
    (step_dir / "UNREGISTERED-optimizer.pt").write_bytes(OPTIMIZER)
    (step_dir / "notes").mkdir()
    (step_dir / "notes" / "run.txt").write_bytes(b"notes")
    (step_dir / partial_name("other.bin")).write_bytes(b"someone's")

    copies = recorded(store, ref.job, ref.step, ["a.bin", "model/r0.bin", "model/r1.bin"])
    report = store.delete_checkpoint(ref.job, ref.step, copies)

    assert report.deleted == 2
    assert not (step_dir / "a.bin").exists()
    assert not (step_dir / "model").exists()  # emptied: its shards and our temp file are gone
    assert (step_dir / "UNREGISTERED-optimizer.pt").read_bytes() == OPTIMIZER
    assert (step_dir / "notes" / "run.txt").read_bytes() == b"notes"
    assert (step_dir / partial_name("other.bin")).read_bytes() == b"someone's"
    assert set(report.left) == {
        "UNREGISTERED-optimizer.pt",
        "notes/run.txt",
        partial_name("other.bin"),
    }
    # Idempotent; and once the job's own files are gone the directories go too, up to <job>.
    assert store.delete_checkpoint(ref.job, ref.step, copies).deleted == 0
    for leftover in report.left:
        (step_dir / leftover).unlink()
    assert store.delete_checkpoint(ref.job, ref.step, copies).left == ("notes",)
    (step_dir / "notes").rmdir()
    assert store.delete_checkpoint(ref.job, ref.step, copies).left == ()
    assert list(store.root.iterdir()) == []


def test_posix_delete_of_one_shard_keeps_its_neighbours(store: PosixStore) -> None:
    ref = new_ref("dir/a.bin")
    written = store.write(ref, io.BytesIO(b"shard"), 5, None, None).identity
    neighbour = store.root / ref.job / str(ref.step) / "dir" / "UNREGISTERED-optimizer.pt"
    neighbour.write_bytes(OPTIMIZER)
    store.delete(ref, written)
    assert store.size(ref) is None
    assert neighbour.read_bytes() == OPTIMIZER


def test_s3_deletes_only_the_given_keys(s3_store: S3Store, raw_s3: Any) -> None:
    ref = new_ref("a.bin")
    died = ShardRef(ref.job, ref.step, "big.bin")
    s3_store.write(ref, io.BytesIO(b"shard"), 5, None, None)
    _interrupted_write(s3_store, died, 11 * MiB)
    prefix = s3_store.checkpoint_prefix(ref.job, ref.step)
    stranger = prefix + "UNREGISTERED-optimizer.pt"
    raw_s3.put_object(Bucket=s3_store.bucket, Key=stranger, Body=OPTIMIZER)
    # An upload someone else has in progress under the same prefix is not ours to abort.
    foreign = raw_s3.create_multipart_upload(Bucket=s3_store.bucket, Key=prefix + "theirs.bin")

    report = s3_store.delete_checkpoint(
        ref.job, ref.step, [RecordedCopy("a.bin"), RecordedCopy("big.bin")]
    )

    assert s3_store.size(ref) is None
    body = raw_s3.get_object(Bucket=s3_store.bucket, Key=stranger)["Body"].read()
    assert body == OPTIMIZER
    pending = raw_s3.list_multipart_uploads(Bucket=s3_store.bucket, Prefix=prefix)
    assert [u["UploadId"] for u in pending.get("Uploads", [])] == [foreign["UploadId"]]
    assert report.left == ("UNREGISTERED-optimizer.pt",)


def test_reconcile_removes_only_regular_files_named_like_our_temp_files(
    store: PosixStore, tmp_path: Path
) -> None:
    ref = new_ref("a.bin")
    _interrupted_write(store, ref, MiB)
    step_dir = store.root / ref.job / str(ref.step)
    (step_dir / "UNREGISTERED-optimizer.pt").write_bytes(OPTIMIZER)
    (step_dir / "notes.tierpoint-partial").write_bytes(b"a job's own name")
    outside = tmp_path / "outside"
    outside.write_bytes(b"not ours")
    (step_dir / partial_name("b.bin")).symlink_to(outside)

    step = str(ref.step)
    assert store.remove_temp(ref.job, f"{step}/{partial_name('a.bin')}")
    assert not store.remove_temp(ref.job, f"{step}/UNREGISTERED-optimizer.pt")
    assert not store.remove_temp(ref.job, f"{step}/notes.tierpoint-partial")
    assert not store.remove_temp(ref.job, f"{step}/{partial_name('b.bin')}")
    assert (step_dir / "UNREGISTERED-optimizer.pt").read_bytes() == OPTIMIZER
    assert (step_dir / "notes.tierpoint-partial").exists()
    assert (step_dir / partial_name("b.bin")).is_symlink()
    assert outside.read_bytes() == b"not ours"
    assert not (step_dir / partial_name("a.bin")).exists()


# ---- only the bytes the catalog verified -----------------------------------------------------


def _step_dir(store: PosixStore, ref: ShardRef) -> Path:
    return store.root / ref.job / str(ref.step)


def _write_again(path: Path, data: bytes) -> None:
    """What a job writing the step again does: a new file renamed onto the path."""
    tmp = path.with_name(path.name + ".job-tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def test_posix_keeps_a_file_written_at_a_shards_path_since_it_was_verified(
    store: PosixStore,
) -> None:
    """The job wrote the step again after the catalog verified it: the same size, even the same
    bytes, but another file. A delete keeps it and says so; the verified neighbour goes."""
    ref = new_ref("a.bin")
    other = ShardRef(ref.job, ref.step, "b.bin")
    for r in (ref, other):
        store.write(r, io.BytesIO(b"old shard"), 9, None, None)
    copies = recorded(store, ref.job, ref.step, [ref.path, other.path])
    path = _step_dir(store, ref) / "a.bin"
    _write_again(path, b"old shard")

    report = store.delete_checkpoint(ref.job, ref.step, copies)

    assert (report.deleted, report.kept) == (1, ("a.bin",))
    assert path.read_bytes() == b"old shard"
    assert not (_step_dir(store, ref) / "b.bin").exists()
    assert report.left == ("a.bin",)
    # Nothing of ours is left beside it: the file was put back, not left aside.
    assert sorted(p.name for p in _step_dir(store, ref).iterdir()) == ["a.bin"]


def test_posix_keeps_a_file_rewritten_in_place(store: PosixStore) -> None:
    """Same inode, new bytes written into it: its modification time tells it apart."""
    ref = new_ref("a.bin")
    store.write(ref, io.BytesIO(b"old shard"), 9, None, None)
    copies = recorded(store, ref.job, ref.step, [ref.path])
    path = _step_dir(store, ref) / "a.bin"
    before = path.stat()
    with open(path, "r+b") as f:
        f.write(b"new")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns + 1))  # coarse clocks

    report = store.delete_checkpoint(ref.job, ref.step, copies)

    assert report.kept == ("a.bin",) and path.read_bytes() == b"new shard"


def test_posix_without_a_recorded_identity_deletes_only_the_registered_bytes(
    store: PosixStore,
) -> None:
    """A replica recorded before identities were (or never read back): its file goes only if its
    bytes are the registered ones, and never without a registered crc32c."""
    good = new_ref("good.bin")
    job, step = good.job, good.step
    bad, unchecked = ShardRef(job, step, "bad.bin"), ShardRef(job, step, "unchecked.bin")
    for r in (good, bad, unchecked):
        store.write(r, io.BytesIO(b"registered"), 10, None, None)
    registered = recorded(store, job, step, ["good.bin"])[0].crc32c
    _write_again(_step_dir(store, good) / "bad.bin", b"other byte")
    copies = [
        RecordedCopy("good.bin", 10, registered),
        RecordedCopy("bad.bin", 10, registered),
        RecordedCopy("unchecked.bin", 10, None),
    ]

    report = store.delete_checkpoint(job, step, copies)

    assert report.deleted == 1 and set(report.kept) == {"bad.bin", "unchecked.bin"}
    assert store.size(good) is None
    assert store.size(bad) == 10 and store.size(unchecked) == 10


def test_what_an_interrupted_delete_left_aside_is_settled_by_the_next(store: PosixStore) -> None:
    """A delete renames a file aside before it checks it; one that died there left it aside.
    The next delete unlinks it if it is the recorded file, else puts it back, and never over a
    file that is at the path by then."""
    ref = new_ref("a.bin")
    store.write(ref, io.BytesIO(b"verified"), 8, None, None)
    copies = recorded(store, ref.job, ref.step, [ref.path])
    step_dir = _step_dir(store, ref)
    path, aside = step_dir / "a.bin", step_dir / aside_name("a.bin")

    os.rename(path, aside)  # the recorded file, aside
    report = store.delete_checkpoint(ref.job, ref.step, copies)
    assert report.deleted == 1 and not aside.exists() and not step_dir.exists()

    store.write(ref, io.BytesIO(b"verified"), 8, None, None)
    copies = recorded(store, ref.job, ref.step, [ref.path])
    _write_again(path, b"newer")
    os.rename(path, aside)  # a newer file, aside, nothing at the path
    report = store.delete_checkpoint(ref.job, ref.step, copies)
    assert report.kept == ("a.bin",) and path.read_bytes() == b"newer" and not aside.exists()

    os.rename(path, aside)  # a newer file aside, and the newest at the path
    path.write_bytes(b"newest")
    report = store.delete_checkpoint(ref.job, ref.step, copies)
    assert report.kept == ("a.bin",)
    assert path.read_bytes() == b"newest" and aside.read_bytes() == b"newer"
    assert aside.name in report.left


def test_a_copy_takes_back_only_the_file_it_wrote(store: PosixStore) -> None:
    ref = new_ref("a.bin")
    written = store.write(ref, io.BytesIO(b"copied"), 6, None, None).identity
    path = _step_dir(store, ref) / "a.bin"
    _write_again(path, b"theirs")
    store.delete(ref, written)
    assert path.read_bytes() == b"theirs"
    store.delete(ref, None)  # a copy that committed nothing removes no shard
    assert path.read_bytes() == b"theirs"
    mine = store.write(ref, io.BytesIO(b"copied"), 6, None, None).identity
    store.delete(ref, mine)
    assert not path.exists()


def test_a_file_renamed_onto_the_path_during_deletes_is_never_lost(store: PosixStore) -> None:
    """A writer renames new files onto a shard's path while deletes of the verified copy run:
    whatever the interleaving, the writer's last file is there afterwards (at the path, or aside
    when the path was taken again before it could be put back)."""
    ref = new_ref("a.bin")
    store.write(ref, io.BytesIO(b"verified"), 8, None, None)
    copies = recorded(store, ref.job, ref.step, [ref.path])
    step_dir = _step_dir(store, ref)
    path, aside = step_dir / "a.bin", step_dir / aside_name("a.bin")
    rounds = 300
    done = threading.Event()

    def writer() -> None:
        for i in range(rounds):
            _write_again(path, f"write {i}".encode())
        done.set()

    thread = threading.Thread(target=writer)
    thread.start()
    while not done.is_set():
        store.delete_checkpoint(ref.job, ref.step, copies)
    thread.join()
    store.delete_checkpoint(ref.job, ref.step, copies)
    last = f"write {rounds - 1}".encode()
    held = [p.read_bytes() for p in (path, aside) if p.exists()]
    assert last in held, held
