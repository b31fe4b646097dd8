"""Path rules shared with the server, and confinement of restore targets."""

from __future__ import annotations

from pathlib import Path

import pytest
from tierpoint_client import UnsafePathError, safe_join, validate_relative_path


@pytest.mark.parametrize("path", ["a", "a/b/c.bin", "rank-0.pt", "x..y", ".hidden", "a/.b"])
def test_clean_paths_pass(path: str) -> None:
    assert validate_relative_path(path) == path


@pytest.mark.parametrize(
    "path",
    [
        "",
        "/etc/passwd",
        "../x",
        "a/../../x",
        "a/..",
        "./a",
        "a/./b",
        "a//b",
        "a/",
        "a\\b",
        "a\x00b",
        "a\x1fb",
        "bad\udc80name",
        "shard.bin.tierpoint-partial",
        "x" * 256,
        "/".join(["abcdefgh"] * 200),
    ],
)
def test_unsafe_paths_are_refused(path: str) -> None:
    with pytest.raises(UnsafePathError):
        validate_relative_path(path)


def test_safe_join_stays_inside(tmp_path: Path) -> None:
    assert safe_join(tmp_path, "a/b.bin") == tmp_path.resolve() / "a" / "b.bin"
    with pytest.raises(UnsafePathError):
        safe_join(tmp_path, "../escape")


def test_safe_join_refuses_symlinked_directories_leading_out(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (dest / "sub").symlink_to(outside, target_is_directory=True)
    with pytest.raises(UnsafePathError, match="outside"):
        safe_join(dest, "sub/shard.bin")
    (dest / "file.bin").symlink_to(outside / "target")
    with pytest.raises(UnsafePathError, match="symlink"):
        safe_join(dest, "file.bin")
