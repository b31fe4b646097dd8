"""Free space of a POSIX tier's file system, as this process sees it."""

from __future__ import annotations

import os
from pathlib import Path


def disk_space(root: Path) -> tuple[int, int] | None:
    """(free bytes for unprivileged writers, capacity) of the file system holding `root`, or None
    when this process cannot see it (not mounted here, no permission)."""
    try:
        st = os.statvfs(root)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
