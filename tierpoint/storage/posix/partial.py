"""The temp file a POSIX copy writes before it renames it onto the shard's name: taken by one
writer at a time, written whole, and renamed only where a file or nothing is."""

from __future__ import annotations

import errno
import fcntl
import os
import stat

from tierpoint.errors import UnsafePath
from tierpoint.storage.base import ShardRef
from tierpoint.storage.posix.confined import lstat_entry


def lock_partial(fd: int, dir_fd: int, tmp: str) -> None:
    """Take the temp file for this writer alone (two attempts at one shard, e.g. a retry while
    the first attempt still runs, must not interleave their bytes)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise BlockingIOError(
            errno.EWOULDBLOCK, f"another copy is writing {tmp!r}; retry later"
        ) from None
    except OSError as e:
        # Some shared file systems (Lustre without -o flock) do not do flock at all.
        if e.errno not in (errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOLCK, errno.EINVAL):
            raise
    # The inode we locked may have been renamed onto a final name meanwhile: only the inode that
    # is still under the temp name is ours to write.
    try:
        current = lstat_entry(dir_fd, tmp)
    except FileNotFoundError:
        current = None
    st = os.fstat(fd)
    if current is None or (current.st_dev, current.st_ino) != (st.st_dev, st.st_ino):
        raise BlockingIOError(errno.EWOULDBLOCK, f"{tmp!r} was replaced; retry")


def pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    while data:
        n = os.pwrite(fd, data, offset)
        data = data[n:]
        offset += n


def refuse_to_replace(dir_fd: int, name: str, ref: ShardRef) -> None:
    """A copy renames onto a shard's name only where a file or nothing is: a directory or a
    symlink there is not ours to replace."""
    try:
        mode = lstat_entry(dir_fd, name).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        raise UnsafePath(f"shard path {ref.path!r} names an existing directory")
    if stat.S_ISLNK(mode):
        raise UnsafePath(f"shard path {ref.path!r} is a symlink; refusing to replace it")
