"""Confinement guards that the lexical and resolved checks of test_paths do not reach on their own:
the reason given for an absolute path, and a symlink planted at the name a copy writes through."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from tests.helpers.storage import new_ref
from tierpoint.errors import UnsafePath
from tierpoint.storage.paths import validate_relative_path
from tierpoint.storage.posix.store import PosixStore, partial_name


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
