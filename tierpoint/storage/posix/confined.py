"""Reaching a shard without leaving its checkpoint directory: no symlink is ever followed below
the tier root.

A shard lives at `<root>/<job>/<step>/<path>`. Every component below the configured root is a
name we or the job created; none may be a symlink, whether it points out of the root, into
another job's directory, or back inside (a job's own files never need one, and the training
client refuses to register one). The directory above a shard is opened in one `openat2(2)` call
with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS` (Linux 5.6+) relative to the root's descriptor;
where the kernel lacks it, one component at a time with `O_NOFOLLOW`, each relative to the
descriptor of the one before. Both refuse the same paths. The final component is then only ever
used through that directory's descriptor (`*at` calls, `O_NOFOLLOW`), so a symlink swapped in
after a check cannot redirect anything.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import platform
import stat
from collections.abc import Iterator, Sequence

from tierpoint.errors import UnsafePath

# openat2 has one number on the architectures that share the generic syscall table.
_SYS_OPENAT2 = {"x86_64": 437, "aarch64": 437, "arm64": 437, "riscv64": 437, "ppc64le": 437}
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
# guard: posix-paths-refuse-symlinks
_RESOLVE = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
# The kernel may refuse a RESOLVE_BENEATH walk that raced with a rename elsewhere: try again.
_EAGAIN_RETRIES = 8
_MKDIR_ATTEMPTS = 3


class _OpenHow(ctypes.Structure):
    _fields_ = [
        ("flags", ctypes.c_uint64),
        ("mode", ctypes.c_uint64),
        ("resolve", ctypes.c_uint64),
    ]


_libc = ctypes.CDLL(None, use_errno=True)


def _openat2(dir_fd: int, path: str, flags: int) -> int:
    nr = _SYS_OPENAT2.get(platform.machine())
    if nr is None:
        raise OSError(errno.ENOSYS, "openat2 is not known on this architecture")
    how = _OpenHow(flags, 0, _RESOLVE)
    for _ in range(_EAGAIN_RETRIES):
        fd = _libc.syscall(
            ctypes.c_long(nr),
            ctypes.c_int(dir_fd),
            ctypes.c_char_p(os.fsencode(path)),
            ctypes.byref(how),
            ctypes.c_size_t(ctypes.sizeof(how)),
        )
        if fd >= 0:
            return int(fd)
        err = ctypes.get_errno()
        if err != errno.EAGAIN:
            raise OSError(err, os.strerror(err), path)
    raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN), path)


def _probe() -> bool:
    """Whether this kernel (and any seccomp filter around us) lets us call openat2."""
    try:
        fd = _openat2(-100, ".", _DIR_FLAGS)  # AT_FDCWD
    except OSError:
        return False
    os.close(fd)
    return True


OPENAT2 = _probe()


def _refuse(parts: Sequence[str], why: str) -> UnsafePath:
    return UnsafePath(f"{'/'.join(parts)!r}: {why}; refusing to follow it")


def _walk_nofollow(root_fd: int, parts: Sequence[str]) -> int:
    fd = root_fd
    try:
        for i, part in enumerate(parts):
            try:
                # guard: posix-walk-nofollow
                nxt = os.open(part, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as e:
                # O_NOFOLLOW | O_DIRECTORY on a symlink fails with ENOTDIR (or ELOOP): tell a
                # symlink from a plain file in the way.
                if e.errno in (errno.ENOTDIR, errno.ELOOP) and _is_link(fd, part):
                    raise _refuse(parts[: i + 1], "a symlink below the tier root") from None
                raise
            if fd != root_fd:
                os.close(fd)
            fd = nxt
    except BaseException:
        if fd != root_fd:
            os.close(fd)
        raise
    return fd if fd != root_fd else os.dup(root_fd)


def _is_link(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def open_dir(root_fd: int, parts: Sequence[str], *, use_openat2: bool = OPENAT2) -> int:
    """A descriptor of the directory `parts` below the root's descriptor, reached without
    following any symlink. FileNotFoundError if it does not exist (or a component is a file),
    UnsafePath if a component is a symlink."""
    if not parts:
        return os.dup(root_fd)
    try:
        if use_openat2:
            try:
                return _openat2(root_fd, "/".join(parts), _DIR_FLAGS)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.EXDEV):
                    raise _refuse(parts, "a symlink below the tier root") from None
                raise
        return _walk_nofollow(root_fd, parts)
    except NotADirectoryError:
        raise FileNotFoundError(
            errno.ENOENT, f"{'/'.join(parts)!r} is not a directory below the tier root"
        ) from None


def make_dirs(root_fd: int, parts: Sequence[str], *, use_openat2: bool = OPENAT2) -> int:
    """`open_dir`, creating missing directories one level at a time (fsyncing the parent of
    each new one, so a shard renamed into it cannot vanish with it after a crash)."""
    with contextlib.suppress(FileNotFoundError):
        return open_dir(root_fd, parts, use_openat2=use_openat2)
    fd = os.dup(root_fd)
    try:
        for i, part in enumerate(parts):
            nxt = _make_dir(fd, part, use_openat2)
            if nxt is None:
                raise UnsafePath(f"{'/'.join(parts[: i + 1])!r} exists and is not a directory")
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def _make_dir(dir_fd: int, name: str, use_openat2: bool) -> int | None:
    """mkdir (fsyncing the parent when it is new) and open; None if something else is there.
    An expiry may prune the empty directory between our mkdir and open: make it again."""
    for _ in range(_MKDIR_ATTEMPTS):
        try:
            os.mkdir(name, 0o755, dir_fd=dir_fd)
        except FileExistsError:
            pass
        else:
            os.fsync(dir_fd)
        with contextlib.suppress(FileNotFoundError):
            return open_dir(dir_fd, [name], use_openat2=use_openat2)
    return None


@contextlib.contextmanager
def opened(fd: int) -> Iterator[int]:
    try:
        yield fd
    finally:
        os.close(fd)


def open_root(root: str) -> int:
    """The configured tier root itself may be a symlink (an operator's choice): follow it."""
    return os.open(root, _DIR_FLAGS)


def open_entry(dir_fd: int, name: str, flags: int, mode: int = 0o644) -> int:
    """Open `name` in the directory, never following a symlink there."""
    try:
        # guard: posix-entry-nofollow
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UnsafePath(f"{name!r} is a symlink; refusing to follow it") from None
        raise


def lstat_entry(dir_fd: int, name: str) -> os.stat_result:
    return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
