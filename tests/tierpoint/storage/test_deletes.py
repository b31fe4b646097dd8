"""We delete only what we registered: a store's deletion of a checkpoint removes the shards it is
named and its own temp files, leaves every other file or object where it is (and names it), and
removes a directory only once it is empty. Each POSIX test runs with the kernel resolving paths
(openat2) and with the component-by-component fallback."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.storage import InterruptedSource, MiB, new_ref
from tierpoint.config import TierConfig, TierKind
from tierpoint.storage.base import ShardRef
from tierpoint.storage.paths import partial_name
from tierpoint.storage.posix.confined import OPENAT2
from tierpoint.storage.posix.store import PosixStore
from tierpoint.storage.s3.store import S3Store

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

    report = store.delete_checkpoint(ref.job, ref.step, ["a.bin", "model/r0.bin", "model/r1.bin"])

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
    assert store.delete_checkpoint(ref.job, ref.step, ["a.bin"]).deleted == 0
    for leftover in report.left:
        (step_dir / leftover).unlink()
    assert store.delete_checkpoint(ref.job, ref.step, ["a.bin"]).left == ("notes",)
    (step_dir / "notes").rmdir()
    assert store.delete_checkpoint(ref.job, ref.step, ["a.bin"]).left == ()
    assert list(store.root.iterdir()) == []


def test_posix_delete_of_one_shard_keeps_its_neighbours(store: PosixStore) -> None:
    ref = new_ref("dir/a.bin")
    store.write(ref, io.BytesIO(b"shard"), 5, None, None)
    neighbour = store.root / ref.job / str(ref.step) / "dir" / "UNREGISTERED-optimizer.pt"
    neighbour.write_bytes(OPTIMIZER)
    store.delete(ref)
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

    report = s3_store.delete_checkpoint(ref.job, ref.step, ["a.bin", "big.bin"])

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
