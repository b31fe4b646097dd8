"""Listing a POSIX tree as reconciliation reads it: every entry but directories, no symlink
followed."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

# (name relative to the job's directory or prefix, size, modified at as epoch seconds)
Entry = tuple[str, int, float]


def walk(top: Path) -> Iterator[Entry]:
    """Every non-directory under top (symlinks are not followed), relative to it; a size of -1
    for what is not a regular file."""
    for dirpath, _dirs, files in os.walk(top, followlinks=False):
        for f in files:
            full = os.path.join(dirpath, f)
            try:
                st = os.lstat(full)
            except FileNotFoundError:
                continue
            size = st.st_size if stat.S_ISREG(st.st_mode) else -1
            yield os.path.relpath(full, top).replace(os.sep, "/"), size, st.st_mtime
