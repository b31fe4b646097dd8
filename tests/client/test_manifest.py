"""Manifest building and hashing, no server needed."""

from __future__ import annotations

import os
from pathlib import Path

import crc32c
import pytest
from tierpoint_client import ManifestError, ShardSpec, UnsafePathError, build_manifest
from tierpoint_client.hashing import file_crc32c, hash_files


def _write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("size", [0, 1, 4096, 4 * 1024 * 1024, 4 * 1024 * 1024 + 17])
def test_file_crc32c_equals_crc32c_of_the_whole_file(tmp_path: Path, size: int) -> None:
    data = os.urandom(size)
    f = _write(tmp_path / "shard.bin", data)
    # Small chunks force many incremental updates through the reused buffer.
    assert file_crc32c(f, chunk_size=65536) == (size, f"{crc32c.crc32c(data):08x}")
    assert file_crc32c(f) == (size, f"{crc32c.crc32c(data):08x}")


def test_hash_files_keeps_order_across_threads(tmp_path: Path) -> None:
    blobs = [os.urandom(n) for n in (10, 300_000, 0, 70_000, 1_000_000, 5)]
    paths = [_write(tmp_path / f"s{i}", b) for i, b in enumerate(blobs)]
    expected = [(len(b), f"{crc32c.crc32c(b):08x}") for b in blobs]
    assert hash_files(paths, workers=4, chunk_size=8192) == expected
    assert hash_files(paths, workers=1) == expected


def test_manifest_walks_directory_with_relative_posix_paths(tmp_path: Path) -> None:
    ckpt = tmp_path / "job" / "7"
    files = {
        "model/rank0.pt": os.urandom(1000),
        "model/rank1.pt": os.urandom(2000),
        "optim/deep/er/state.bin": os.urandom(3),
        "meta.json": b"{}",
        "empty": b"",
    }
    for rel, data in files.items():
        _write(ckpt / rel, data)
    manifest = build_manifest(ckpt, "node-a", workers=3)
    assert manifest == [
        ShardSpec(rel, len(files[rel]), f"{crc32c.crc32c(files[rel]):08x}", "node-a")
        for rel in sorted(files)
    ]


def test_manifest_from_explicit_files(tmp_path: Path) -> None:
    ckpt = tmp_path / "ck"
    a = _write(ckpt / "a" / "x.bin", b"hello")
    _write(ckpt / "b.bin", b"world")
    _write(ckpt / "ignored.tmp", b"not a shard")
    manifest = build_manifest(ckpt, "n1", files=[a, "b.bin"])
    assert [(s.path, s.size, s.crc32c) for s in manifest] == [
        ("a/x.bin", 5, f"{crc32c.crc32c(b'hello'):08x}"),
        ("b.bin", 5, f"{crc32c.crc32c(b'world'):08x}"),
    ]


def test_manifest_refuses_files_outside_or_missing(tmp_path: Path) -> None:
    ckpt = tmp_path / "ck"
    _write(ckpt / "a.bin", b"x")
    outside = _write(tmp_path / "elsewhere.bin", b"y")
    with pytest.raises(ManifestError, match="not inside"):
        build_manifest(ckpt, "n1", files=[outside])
    with pytest.raises(UnsafePathError):
        build_manifest(ckpt, "n1", files=["../elsewhere.bin"])
    with pytest.raises(ManifestError, match="does not exist"):
        build_manifest(ckpt, "n1", files=["nope.bin"])
    with pytest.raises(ManifestError, match="twice"):
        build_manifest(ckpt, "n1", files=["a.bin", ckpt / "a.bin"])
    with pytest.raises(ManifestError, match="empty"):
        build_manifest(ckpt, "n1", files=[])


def test_manifest_refuses_symlinks_and_empty_or_missing_directories(tmp_path: Path) -> None:
    ckpt = tmp_path / "ck"
    _write(ckpt / "a.bin", b"x")
    secret = _write(tmp_path / "secret", b"s")
    (ckpt / "link.bin").symlink_to(secret)
    with pytest.raises(ManifestError, match="symlink"):
        build_manifest(ckpt, "n1")
    (ckpt / "link.bin").unlink()
    (ckpt / "linkdir").symlink_to(tmp_path, target_is_directory=True)
    with pytest.raises(ManifestError, match="symlink"):
        build_manifest(ckpt, "n1")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ManifestError, match="no files"):
        build_manifest(tmp_path / "empty", "n1")
    with pytest.raises(ManifestError, match="does not exist"):
        build_manifest(tmp_path / "missing", "n1")


def test_manifests_gathered_from_nodes_with_a_file_above_a_file_are_refused_before_sending(
    tmp_path: Path,
) -> None:
    """Node a wrote `model`, node b `model/rank1.pt`: no tier can hold both, so the client
    refuses before any request (this client's API address answers nothing)."""
    from tierpoint_client import Client, RetryPolicy

    a = build_manifest(_write(tmp_path / "a" / "model", b"x").parent, "node-a")
    b = build_manifest(_write(tmp_path / "b" / "model" / "rank1.pt", b"y").parent.parent, "node-b")
    client = Client("http://127.0.0.1:9", retry=RetryPolicy(attempts=1))
    with pytest.raises(ManifestError, match="cannot both be files"):
        client.register_manifest("job", 1, [*a, *b])
    with pytest.raises(ManifestError, match="'m' and 'm/x'"):
        shards = [{"path": "m/x", "size": 1, "node": "n"}, {"path": "m", "size": 1, "node": "n"}]
        client.register_manifest("job", 1, shards)
