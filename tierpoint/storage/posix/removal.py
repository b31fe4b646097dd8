"""Removing a checkpoint's files from a POSIX tier: we delete only what we registered, and of it
only the bytes the catalog verified.

The shards we are named and their temp files go; then each directory that held them, and its
parents up to `<job>/`, while it is empty. Nothing here lists a directory to delete what it
finds: a file the job wrote next to its shards without registering it stays, and so does its
directory. What is left is only listed, for the report.

A shard's file goes only while it is the file the catalog recorded (`remove_recorded`): it is
renamed aside under a name of ours (`.<name>.tierpoint-deleting`), which takes whatever is at the
path at that instant out of everyone's way; what was renamed is then checked (its identity, or
where none was recorded its registered size and crc32c), and unlinked only if it is the recorded
file, else put back without replacing anything that appeared at the path meanwhile
(`noreplace.put_back`). A file written at the path since the catalog verified it, e.g. by a job
writing the step again after an admin deleted it, is therefore never removed: it is kept and
reported. A later attempt settles what an interrupted one left aside the same way.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from tierpoint.errors import UnsafePath
from tierpoint.storage.base import LEFT_EXAMPLES, RecordedCopy
from tierpoint.storage.checksum import crc32c_hex, crc32c_of_stream, parse_crc32c
from tierpoint.storage.paths import aside_name, partial_name
from tierpoint.storage.posix.confined import lstat_entry, open_dir, open_entry, opened
from tierpoint.storage.posix.identity import is_file
from tierpoint.storage.posix.noreplace import move_aside, put_back

# Whether the file `name` (lstat `st`) in the directory is the recorded one.
IsRecorded = Callable[[int, str, os.stat_result], bool]
_CHECK_BUFFER = 1024 * 1024

# rmdir of a directory that is not empty (someone's files, another shard), already gone, or
# not a directory (a symlink put in its place: rmdir does not follow it).
_KEEPS = (errno.ENOTEMPTY, errno.EEXIST, errno.EBUSY, errno.ENOENT, errno.ENOTDIR)


@dataclass(frozen=True)
class Removed:
    deleted: bool = False  # the recorded file was there, and is gone
    kept: bool = False  # another file was found at the shard's path (or aside), and left there


def unlink_temp(dir_fd: int, name: str) -> None:
    """Our temp file of shard `name`: ours by its name, which no shard may have."""
    with contextlib.suppress(FileNotFoundError, IsADirectoryError):
        os.unlink(partial_name(name), dir_fd=dir_fd)


def remove_recorded(dir_fd: int, name: str, is_recorded: IsRecorded) -> Removed:
    """Remove the shard `name` in the directory if it is the recorded file, race-free (see the
    module's docstring). A directory under a shard's name is not ours to remove: it stays (and
    is reported by `left_in`)."""
    aside = aside_name(name)
    earlier = _settle(dir_fd, name, aside, is_recorded)
    try:
        if stat.S_ISDIR(lstat_entry(dir_fd, name).st_mode):
            return earlier
        move_aside(dir_fd, name, aside)
    except FileNotFoundError:
        return earlier
    except FileExistsError:
        # Another delete of this shard moved a file aside just now: that one settles it.
        return earlier
    now = _settle(dir_fd, name, aside, is_recorded)
    return Removed(earlier.deleted or now.deleted, earlier.kept or now.kept)


def _settle(dir_fd: int, name: str, aside: str, is_recorded: IsRecorded) -> Removed:
    """Whatever is aside: unlinked if it is the recorded file, else put back at `name` (or left
    aside, when `name` was taken meanwhile)."""
    try:
        st = lstat_entry(dir_fd, aside)
    except FileNotFoundError:
        return Removed()
    # guard: delete-checks-identity
    if stat.S_ISREG(st.st_mode) and is_recorded(dir_fd, aside, st):
        try:
            os.unlink(aside, dir_fd=dir_fd)
        except FileNotFoundError:
            return Removed()
        return Removed(deleted=True)
    put_back(dir_fd, aside, name)
    return Removed(kept=True)


def recorded_check(copy: RecordedCopy) -> IsRecorded:
    """How to tell the copy's recorded file: by the identity recorded when the catalog read it,
    or, where none was recorded, by reading it now and comparing with the registered size and
    crc32c (and never, without a registered crc32c: such bytes were not verified)."""
    identity = copy.identity
    if identity is not None:
        return lambda _dir_fd, _name, st: is_file(identity, st)
    if copy.crc32c is None:
        return lambda _dir_fd, _name, _st: False
    return lambda dir_fd, name, st: _holds(dir_fd, name, st, copy.size, copy.crc32c or "")


def written_check(identity: str) -> IsRecorded:
    """The file a copy itself committed (`CopyResult.identity`)."""
    return lambda _dir_fd, _name, st: is_file(identity, st)


def _holds(dir_fd: int, name: str, st: os.stat_result, size: int, crc32c: str) -> bool:
    if st.st_size != size:
        return False
    try:
        fd = open_entry(dir_fd, name, os.O_RDONLY)
    except (FileNotFoundError, UnsafePath):
        return False
    with os.fdopen(fd, "rb", buffering=0) as f:
        n, crc = crc32c_of_stream(f, _CHECK_BUFFER)
    return n == size and crc32c_hex(crc) == crc32c_hex(parse_crc32c(crc32c))


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
