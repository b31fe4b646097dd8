"""Programs the tests take from Debian's packages (Ceph's RADOS Gateway, PgBouncer, promtool):
found on PATH or in the system's directories, which `python3 bootstrap.py test` fills as root with
apt-get. Where they are missing a test fails (CI and any machine that could install them must run
it), and is skipped with the reason only where this machine cannot install them: not root, or no
apt-get."""

from __future__ import annotations

import os
import shutil

import pytest

# The packages bootstrap.py installs, by the program a test needs from each.
PACKAGES = {
    "radosgw": ("radosgw", "ceph-mon", "ceph-osd"),
    "ceph-mon": ("radosgw", "ceph-mon", "ceph-osd"),
    "ceph-osd": ("radosgw", "ceph-mon", "ceph-osd"),
    "pgbouncer": ("pgbouncer",),
    "promtool": ("prometheus",),
}
SYSTEM_DIRS = ("/usr/sbin", "/usr/bin", "/sbin", "/bin")


def find(program: str) -> str | None:
    found = shutil.which(program)
    if found:
        return found
    for d in SYSTEM_DIRS:  # /usr/sbin is not on every PATH (pgbouncer lives there)
        path = os.path.join(d, program)
        if os.access(path, os.X_OK):
            return path
    return None


def can_install() -> bool:
    return shutil.which("apt-get") is not None and os.geteuid() == 0


def require(*programs: str) -> dict[str, str]:
    """The path of each program, or the test stops here with what to do."""
    paths = {p: find(p) for p in programs}
    missing = sorted(p for p, path in paths.items() if path is None)
    if missing:
        packages = sorted({pkg for p in missing for pkg in PACKAGES.get(p, (p,))})
        what = f"{', '.join(missing)} not installed (Debian: {' '.join(packages)})"
        if can_install() or os.environ.get("CI"):
            pytest.fail(f"{what}: `python3 bootstrap.py test` installs them")
        pytest.skip(f"{what}, and this machine cannot install them (needs root and apt-get)")
    return {p: str(path) for p, path in paths.items()}
