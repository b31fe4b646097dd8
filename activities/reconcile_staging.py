"""Reconciliation of a node's staging area of a coded peer tier
(`tierpoint/storage/posix/staging.py`): the stripes its encoder cut from the node's own files.

A staged stripe is known while the catalog records that stripe of one of the node's shards on
the tier and it has not expired; anything else in the area is reported extra and never deleted,
and an encoder's temp file older than the grace period is reported abandoned (removed with
`repair`), as on any POSIX root.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from tierpoint.catalog.engine import Sessions
from tierpoint.catalog.stripe.encoding import staged_names
from tierpoint.contract.integrity import Finding, TierReport
from tierpoint.storage.paths import is_partial_name
from tierpoint.storage.posix.staging import STAGING_DIR, StripeStaging
from tierpoint.tier_config import TierConfig

from .reconcile_walk import walk

Note = Callable[[TierReport, Finding, str], None]


def _indexes(staging: StripeStaging, report: TierReport, note: Note) -> list[int]:
    """The stripe indexes the area has directories for; any other entry at its top is extra."""
    try:
        names = sorted(os.listdir(staging.root))
    except FileNotFoundError:
        return []
    code = staging.tier.stripe_code
    width = code.width if code is not None else 0
    found = []
    for name in names:
        if name.isascii() and name.isdigit() and int(name) < width and str(int(name)) == name:
            found.append(int(name))
        else:
            note(report, Finding.EXTRA, f"{STAGING_DIR}/{name}")
    return found


def scan_job(
    sessions: Sessions,
    tier: TierConfig,
    node: str,
    job: str,
    report: TierReport,
    *,
    grace: float,
    repair: bool,
    note: Note,
) -> None:
    """The staged stripes of `job` on `node`, against the catalog's."""
    staging = StripeStaging(tier, node)
    indexes = _indexes(staging, report, note)
    if not indexes:
        return
    with sessions.begin() as s:
        known = staged_names(s, node, tier.name, job)
    for index in indexes:
        top = staging.root / str(index) / job
        if os.path.islink(top) or not top.is_dir():
            continue
        for rel, _size, mtime in walk(top):
            report.scanned += 1
            where = f"{STAGING_DIR}/{index}/{job}/{rel}"
            if is_partial_name(rel.rsplit("/", 1)[-1]):
                if mtime < grace:
                    note(report, Finding.ABANDONED_TEMP, where)
                    if repair:
                        report.cleaned += int(staging.store(index).remove_temp(job, rel))
                continue
            step_s, _, path = rel.partition("/")
            if (index, step_s, path) not in known:
                note(report, Finding.EXTRA, where)
