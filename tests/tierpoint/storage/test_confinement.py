"""Confinement guards that the lexical and resolved checks of test_paths do not reach on their own:
the reason given for an absolute path, and a symlink planted at the name a copy writes through."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from tests.helpers.storage import new_ref
from tierpoint.errors import UnsafePath
from tierpoint.storage.base import RecordedCopy, ShardRef
from tierpoint.storage.paths import partial_name, validate_relative_path
from tierpoint.storage.posix.confined import OPENAT2
from tierpoint.storage.posix.store import PosixStore
from tierpoint.tier_config import TierConfig, TierKind


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("/etc/passwd", "is absolute"),
        ("//etc/passwd", "is absolute"),
        ("a/../../etc", "has a '..' component"),
        ("a\\..\\b", "backslash"),
    ],
)
def test_unsafe_paths_name_what_is_wrong(path: str, reason: str) -> None:
    """The reason goes back to the job that registered the manifest (a 422's message)."""
    with pytest.raises(UnsafePath, match=reason.replace("\\", "\\\\")):
        validate_relative_path(path)


def test_a_symlink_at_the_temp_name_is_not_written_through(
    posix_store: PosixStore, tmp_path: Path
) -> None:
    """A write goes to a temp name next to the shard, then renames it. A symlink put at that
    temp name (pointing out of the root) must not be opened for writing."""
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"precious")
    ref = new_ref("model/rank-0.bin")
    cp = posix_store.root / ref.job / str(ref.step) / "model"
    cp.mkdir(parents=True)
    (cp / partial_name("rank-0.bin")).symlink_to(outside)
    with pytest.raises(UnsafePath):
        posix_store.write(ref, io.BytesIO(b"new bytes"), 9, None, None)
    assert outside.read_bytes() == b"precious"
    assert not (cp / "rank-0.bin").exists()


RESOLVERS = [
    pytest.param(
        True,
        id="openat2",
        marks=pytest.mark.skipif(not OPENAT2, reason="this kernel has no openat2"),
    ),
    pytest.param(False, id="nofollow-walk"),
]


@pytest.fixture(params=RESOLVERS)
def store(request: pytest.FixtureRequest, shared_root: Path) -> PosixStore:
    tier = TierConfig(name="lustre", kind=TierKind.SHARED, root=str(shared_root))
    return PosixStore(tier, openat2=request.param)


def _victim(store: PosixStore) -> ShardRef:
    """Another job's verified-looking shard, inside the same tier root."""
    victim = ShardRef("gpt-x", 10, "model/r0.bin")
    store.write(victim, io.BytesIO(b"gpt-x weights"), 13, None, None)
    return victim


def _refused_everywhere(store: PosixStore, ref: ShardRef) -> None:
    with pytest.raises(UnsafePath):
        store.checksum(ref)
    with pytest.raises(UnsafePath):
        store.open_read(ref)
    with pytest.raises(UnsafePath):
        store.size(ref)
    with pytest.raises(UnsafePath):
        store.verify(ref, 13, "00000000")
    with pytest.raises(UnsafePath):
        store.write(ref, io.BytesIO(b"new"), 3, None, None)


@pytest.mark.parametrize(
    ("link", "target", "shard"),
    [
        # The shard itself is a symlink to another job's file.
        ("llama-sym/4/stolen.bin", "../../gpt-x/10/model/r0.bin", "stolen.bin"),
        # A directory above the shard is a symlink to another job's directory.
        ("llama-sym/4/model", "../../gpt-x/10/model", "model/r0.bin"),
        # The step directory, and the job directory.
        ("llama-sym/4", "../gpt-x/10", "model/r0.bin"),
        ("llama-sym", "gpt-x", "model/r0.bin"),
    ],
)
def test_a_symlink_to_another_jobs_files_inside_the_root_is_refused(
    store: PosixStore, link: str, target: str, shard: str
) -> None:
    victim = _victim(store)
    path = store.root / link
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target)
    ref = ShardRef("llama-sym", 4 if link != "llama-sym" else 10, shard)
    _refused_everywhere(store, ref)
    if link.endswith(shard):
        # A symlink at the shard's own name is not a file the catalog verified: it is kept and
        # reported, and nothing is deleted through it.
        report = store.delete_checkpoint(ref.job, ref.step, [RecordedCopy(ref.path)])
        assert path.is_symlink() and report.kept == (ref.path,)
    else:
        # Nothing is deleted through a symlinked directory.
        with pytest.raises(UnsafePath):
            store.delete_checkpoint(ref.job, ref.step, [RecordedCopy(ref.path)])
        with pytest.raises(UnsafePath):
            store.delete(ref, None)
    with store.open_read(victim) as f:
        assert f.read() == b"gpt-x weights"


def test_a_file_where_a_directory_must_be_is_refused(store: PosixStore) -> None:
    file = ShardRef("job", 1, "a")
    store.write(file, io.BytesIO(b"x"), 1, None, None)
    with pytest.raises(UnsafePath, match="not a directory"):
        store.write(ShardRef("job", 1, "a/b"), io.BytesIO(b"y"), 1, None, None)
    assert store.size(ShardRef("job", 1, "a/b")) is None
    with store.open_read(file) as f:
        assert f.read() == b"x"
