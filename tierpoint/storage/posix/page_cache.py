"""Between the page cache and the device: ranged writeback with sync_file_range (Linux), dropping
a file's cached pages (and those of the same file in a job's older checkpoints, for a tier whose
`page_cache` is `keep_newest`), and fsync of a directory."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import cast

from tierpoint.errors import UnsafePath
from tierpoint.storage.paths import validate_name, validate_relative_path
from tierpoint.storage.posix.confined import open_dir, open_entry, open_root, opened

_SYNC_FILE_RANGE_WAIT_BEFORE = 1
_SYNC_FILE_RANGE_WRITE = 2
_SYNC_FILE_RANGE_WAIT_AFTER = 4


def _load_sync_file_range() -> Callable[[int, int, int, int], int] | None:
    # Linux only, and not exposed by the os module.
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        fn = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return cast(Callable[[int, int, int, int], int], fn)


_sync_file_range = _load_sync_file_range()


def start_writeback(fd: int, offset: int, length: int) -> None:
    if _sync_file_range is not None and length > 0:
        _sync_file_range(fd, offset, length, _SYNC_FILE_RANGE_WRITE)


def wait_writeback(fd: int, offset: int, length: int) -> bool:
    """Write back [offset, offset+length) and wait for it; False if the call is unavailable."""
    if _sync_file_range is None or length <= 0:
        return False
    flags = _SYNC_FILE_RANGE_WAIT_BEFORE | _SYNC_FILE_RANGE_WRITE | _SYNC_FILE_RANGE_WAIT_AFTER
    if _sync_file_range(fd, offset, length, flags) != 0:
        err = ctypes.get_errno()
        if err in (errno.ENOSYS, errno.EINVAL, errno.ESPIPE, errno.EOPNOTSUPP):
            return False
        raise OSError(err, os.strerror(err))
    return True


def drop_cache(fd: int, offset: int = 0, length: int = 0) -> None:
    # Advisory: some filesystems ignore it, which only costs cache, never correctness.
    with contextlib.suppress(OSError):
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)


def drop_older_steps(root: str, job: str, step: int, rel: str, *, use_openat2: bool) -> int:
    """Drop the cached pages of file `rel` in the job's checkpoints older than `step` on the tier
    rooted at `root`, each reached without following a symlink; returns how many files were
    dropped. A restart loads the newest checkpoint: its pages are the ones worth keeping, and a
    job's files keep their names from step to step (DCP's `__<rank>_<n>.distcp`), so this holds
    the cache at about one checkpoint per node. Advisory: what cannot be opened is skipped."""
    *sub, name = validate_relative_path(rel).split("/")
    dropped = 0
    try:
        with opened(open_root(root)) as root_fd:
            job_fd = open_dir(root_fd, [validate_name(job)], use_openat2=use_openat2)
        with opened(job_fd):
            older = [d for d in os.listdir(job_fd) if d.isdigit() and str(int(d)) == d]
            for d in sorted((int(d) for d in older if int(d) < step), reverse=True):
                dropped += _drop_entry(job_fd, [str(d), *sub], name, use_openat2)
    except (OSError, UnsafePath):
        pass
    return dropped


def _drop_entry(job_fd: int, parts: list[str], name: str, use_openat2: bool) -> int:
    try:
        with opened(open_dir(job_fd, parts, use_openat2=use_openat2)) as dir_fd:
            # Non-blocking: a FIFO planted at the name must not stall the copy that opens it.
            fd = open_entry(dir_fd, name, os.O_RDONLY | os.O_NONBLOCK)
        with opened(fd):
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return 0
            drop_cache(fd)
            return 1
    except (OSError, UnsafePath):
        return 0


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
