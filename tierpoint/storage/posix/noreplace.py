"""Renames within one directory that never replace what is at the destination.

`rename(2)` replaces its destination without a word. A delete that moves a file aside to check it,
and puts it back when it is not the file it may remove, must never replace the file that took its
place meanwhile: `renameat2(2)` with `RENAME_NOREPLACE` (Linux 3.15+; ext4, XFS, btrfs, tmpfs,
NFSv4 and more) fails with EEXIST instead. Where the call or the file system lacks it, `link(2)`
then `unlink(2)` of the source does the same for putting back (the link fails with EEXIST, and the
source is ours to unlink). Moving a shard aside cannot take that way: the unlink by name after the
link could remove a file renamed onto the shard's path in between. There a plain rename is used,
after the caller made sure that nothing is aside: only another delete of the same shard, at the
same moment, on such a file system, could then be replaced.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os

RENAME_NOREPLACE = 1
# What the kernel (or the file system) answers when it cannot rename without replacing.
_UNSUPPORTED = (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP)

_libc = ctypes.CDLL(None, use_errno=True)
_renameat2 = getattr(_libc, "renameat2", None)  # glibc 2.28+


class NoReplaceUnsupported(OSError):
    """renameat2 with RENAME_NOREPLACE is not available here."""


def renameat_noreplace(dir_fd: int, src: str, dst: str) -> None:
    """Rename `src` to `dst` in the directory, or raise FileExistsError if `dst` exists (and
    FileNotFoundError if `src` does not); NoReplaceUnsupported where it cannot be done so."""
    if _renameat2 is None:
        raise NoReplaceUnsupported(errno.ENOSYS, "renameat2 is not in this C library")
    rc = _renameat2(
        ctypes.c_int(dir_fd),
        ctypes.c_char_p(os.fsencode(src)),
        ctypes.c_int(dir_fd),
        ctypes.c_char_p(os.fsencode(dst)),
        ctypes.c_uint(RENAME_NOREPLACE),
    )
    if rc == 0:
        return
    err = ctypes.get_errno()
    if err in _UNSUPPORTED:
        raise NoReplaceUnsupported(err, os.strerror(err), src)
    if err == errno.EEXIST:
        raise FileExistsError(err, os.strerror(err), dst)
    if err == errno.ENOENT:
        raise FileNotFoundError(err, os.strerror(err), src)
    raise OSError(err, os.strerror(err), src)


def move_aside(dir_fd: int, name: str, aside: str) -> None:
    """Rename `name` to `aside`: FileNotFoundError when `name` is not there, FileExistsError
    when something already is aside (a plain rename where RENAME_NOREPLACE is missing: the
    caller has just found `aside` free)."""
    try:
        renameat_noreplace(dir_fd, name, aside)
    except NoReplaceUnsupported:
        os.rename(name, aside, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def put_back(dir_fd: int, aside: str, name: str) -> bool:
    """Rename `aside` back to `name` unless something is at `name` now: True when it is back
    (or already gone from aside: another delete of the shard settled it), False when it stays
    aside because `name` was taken meanwhile, or this file system can do neither."""
    try:
        # guard: delete-puts-back-without-replacing
        renameat_noreplace(dir_fd, aside, name)
        return True
    except FileExistsError:
        return False
    except FileNotFoundError:
        return True
    except NoReplaceUnsupported:
        pass
    try:
        os.link(aside, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
    except FileExistsError:
        return False
    except FileNotFoundError:
        return True
    except OSError as e:
        if e.errno in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV):
            return False  # no hard links here either: it stays aside, and is reported
        raise
    with contextlib.suppress(FileNotFoundError):
        os.unlink(aside, dir_fd=dir_fd)
    return True
