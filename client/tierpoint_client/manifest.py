"""Turn a checkpoint directory (or an explicit list of its files) into a manifest."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

from tierpoint_client.errors import ManifestError
from tierpoint_client.hashing import hash_files
from tierpoint_client.models import ShardSpec
from tierpoint_client.paths import check_no_path_conflict, validate_relative_path

PathLike = str | os.PathLike[str]


def walk_shards(directory: PathLike) -> list[str]:
    """Relative POSIX paths of every regular file under directory, sorted.

    Symlinks are refused rather than followed: the workers read the tier confined to its root, and a
    link would either escape it or make the manifest depend on files outside the checkpoint.
    """
    root = Path(directory)
    if not root.is_dir():
        raise ManifestError(f"checkpoint directory {os.fspath(directory)!r} does not exist")
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in (*dirnames, *filenames):
            full = Path(dirpath, name)
            mode = full.lstat().st_mode
            if stat.S_ISLNK(mode):
                raise ManifestError(f"{full.relative_to(root).as_posix()!r} is a symlink")
            if name in filenames and not stat.S_ISREG(mode):
                raise ManifestError(f"{full.relative_to(root).as_posix()!r} is not a regular file")
            if name in filenames:
                found.append(full.relative_to(root).as_posix())
    if not found:
        raise ManifestError(f"checkpoint directory {os.fspath(directory)!r} holds no files")
    return sorted(found)


def relative_shards(directory: PathLike, files: Iterable[PathLike]) -> list[str]:
    """Normalise an explicit file list (absolute inside directory, or relative to it)."""
    root = Path(os.path.abspath(directory))
    out: list[str] = []
    for f in files:
        p = Path(f)
        if p.is_absolute():
            try:
                rel = Path(os.path.abspath(p)).relative_to(root)
            except ValueError:
                raise ManifestError(f"{os.fspath(f)!r} is not inside {os.fspath(root)!r}") from None
        else:
            rel = p
        posix = PurePosixPath(*rel.parts).as_posix()
        validate_relative_path(posix)
        full = root / rel
        try:
            mode = full.lstat().st_mode
        except FileNotFoundError:
            raise ManifestError(
                f"shard {posix!r} does not exist under {os.fspath(root)!r}"
            ) from None
        if not stat.S_ISREG(mode):
            raise ManifestError(f"shard {posix!r} is not a regular file")
        out.append(posix)
    if not out:
        raise ManifestError("the file list is empty")
    if len(set(out)) != len(out):
        raise ManifestError("the file list names a shard twice")
    return out


def build_manifest(
    directory: PathLike,
    node: str,
    files: Iterable[PathLike] | None = None,
    workers: int = 8,
) -> list[ShardSpec]:
    """Manifest entries with size and crc32c of every shard, hashed in parallel."""
    rels = walk_shards(directory) if files is None else relative_shards(directory, files)
    for rel in rels:
        validate_relative_path(rel)
    check_no_path_conflict(rels)
    root = Path(directory)
    sums = hash_files([root.joinpath(*r.split("/")) for r in rels], workers=workers)
    return [
        ShardSpec(path=rel, size=size, crc32c=crc, node=node)
        for rel, (size, crc) in zip(rels, sums, strict=True)
    ]
