"""Scratch directories of ours in the machine's temp directory, for bytes that are no shard's
yet: a rebuild's fetched stripes (a file's worth of bytes) and the stripe it cuts from them.

A directory removed when its user is done is not enough: a worker killed mid-way (SIGKILL, the
OOM killer, a node's power) never gets there, and nothing else knows the directory is ours. So
each one lies in an area of its own kind (`<temp dir>/<area>/attempt-*`) and is locked (flock)
by the attempt using it for as long as it lives; the kernel drops the lock with the process.
Each new attempt first removes the directories in its area that no process holds: a worker
restarted on the node reclaims what the killed one left the first time it needs scratch again.
Nothing else in the area is touched. An area that is not a directory of this user's (a symlink
or another user's directory planted in a shared /tmp) is not used, nor may it stop a rebuild: the
attempt takes a private directory as before, which only it removes, and the log says so.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tierpoint import logs
from tierpoint.errors import UnsafePath

log = logs.get(__name__)

_ATTEMPT = "attempt-"


def _open_dir(path: str | Path) -> int:
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)


def _area(name: str) -> Path:
    area = Path(tempfile.gettempdir()) / name
    with contextlib.suppress(FileExistsError):
        os.mkdir(area, 0o700)
    st = os.lstat(area)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise UnsafePath(f"scratch area {area} is not a directory of this user's")
    return area


def _reclaim(area: Path) -> None:
    """Remove the attempts' directories that no live attempt holds locked."""
    for entry in os.scandir(area):
        if not entry.name.startswith(_ATTEMPT) or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            fd = _open_dir(entry.path)
        except OSError:
            continue
        try:
            try:
                # guard: live-scratch-never-reclaimed
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a live attempt's
            # guard: abandoned-scratch-reclaimed
            shutil.rmtree(entry.path, ignore_errors=True)
        finally:
            os.close(fd)


@contextlib.contextmanager
def scratch_dir(area_name: str) -> Iterator[Path]:
    """A new, empty directory of this attempt's alone in the area `area_name`, removed on the
    way out; the area's directories left by attempts that died are removed first."""
    try:
        area = _area(area_name)
    except UnsafePath as exc:
        log.warning("scratch area not used", reason=str(exc))
        with tempfile.TemporaryDirectory(prefix=f"{area_name}-") as private:
            yield Path(private)
        return
    area_fd = _open_dir(area)
    try:
        # One attempt at a time creates or reclaims: a directory just made is locked before any
        # other attempt looks at it.
        fcntl.flock(area_fd, fcntl.LOCK_EX)
        _reclaim(area)
        path = Path(tempfile.mkdtemp(prefix=_ATTEMPT, dir=area))
        fd = _open_dir(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(fd)
            shutil.rmtree(path, ignore_errors=True)
            raise
    finally:
        os.close(area_fd)  # and with it the area's lock
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        os.close(fd)
