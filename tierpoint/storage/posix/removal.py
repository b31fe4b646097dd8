"""Removing a checkpoint's files from a POSIX tier: we delete only what we registered.

The shards we are named and their temp files go; then each directory that held them, and its
parents up to `<job>/`, while it is empty. Nothing here lists a directory to delete what it
finds: a file the job wrote next to its shards without registering it stays, and so does its
directory. What is left is only listed, for the report.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable

from tierpoint.errors import UnsafePath
from tierpoint.storage.base import LEFT_EXAMPLES
from tierpoint.storage.paths import partial_name
from tierpoint.storage.posix.confined import lstat_entry, open_dir, opened

# rmdir of a directory that is not empty (someone's files, another shard), already gone, or
# not a directory (a symlink put in its place: rmdir does not follow it).
_KEEPS = (errno.ENOTEMPTY, errno.EEXIST, errno.EBUSY, errno.ENOENT, errno.ENOTDIR)


def unlink_shard(dir_fd: int, name: str) -> int:
    """Unlink the shard `name` and its temp file in the directory; 1 if the shard was there.
    A directory under a shard's name is not ours to remove: it stays (and is reported)."""
    gone = 0
    for n in (name, partial_name(name)):
        try:
            os.unlink(n, dir_fd=dir_fd)
        except (FileNotFoundError, IsADirectoryError):
            continue
        gone += n == name
    return gone


def rmdir_if_empty(root_fd: int, parts: list[str], use_openat2: bool) -> None:
    try:
        with opened(open_dir(root_fd, parts[:-1], use_openat2=use_openat2)) as parent:
            os.rmdir(parts[-1], dir_fd=parent)
    except OSError as e:
        if e.errno not in _KEEPS:
            raise


def prune(root_fd: int, dirs: Iterable[tuple[str, ...]], use_openat2: bool) -> None:
    """rmdir each of `dirs` (parts below the root) and each of its parents up to `<job>`, deepest
    first, each only while it is empty; never the root."""
    every = {d[:i] for d in dirs for i in range(1, len(d) + 1)}
    for d in sorted(every, key=len, reverse=True):
        rmdir_if_empty(root_fd, list(d), use_openat2)


def left_in(root_fd: int, base: list[str], use_openat2: bool) -> tuple[str, ...]:
    """Up to LEFT_EXAMPLES entries still under the directory `base` (links are not followed)."""
    try:
        dir_fd = open_dir(root_fd, base, use_openat2=use_openat2)
    except (FileNotFoundError, UnsafePath):
        return ()
    left: list[str] = []
    with opened(dir_fd):
        for top, dirs, files, top_fd in os.fwalk(".", dir_fd=dir_fd, follow_symlinks=False):
            # fwalk lists a symlink to a directory among the directories and does not enter it.
            links = [d for d in dirs if stat.S_ISLNK(lstat_entry(top_fd, d).st_mode)]
            names = [os.path.normpath(os.path.join(top, n)) for n in sorted(files) + links]
            if top != "." and not dirs and not files:
                names.append(os.path.normpath(top))  # an empty directory that is not ours
            for name in names:
                left.append(name)
                if len(left) >= LEFT_EXAMPLES:
                    return tuple(left)
    return tuple(left)
