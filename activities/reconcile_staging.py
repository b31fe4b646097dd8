"""Reconciliation of a coded peer tier on a node: the stripes it holds for other nodes under its
root of the tier, and its staging area (`tierpoint/storage/posix/staging.py`), the stripes its
encoder cut from the node's own files.

A held stripe is known while the catalog records it on this holder and it has not expired; a
verified one missing or of another size than recorded is reported, and with `repair` recorded
lost or corrupt through the stripe machine (`found bad`): its set then counts one stripe fewer.

A staged stripe is known while the catalog records that stripe of one of the node's shards on
the tier and it has not expired; anything else in the area is reported extra and never deleted,
and an encoder's temp file older than the grace period is reported abandoned (removed with
`repair`), as on any POSIX root. Stripes recorded found bad are cut again by their copy's
rebuild, asked for once the move is committed (`tierpoint/services/stripe_rebuild.py`).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tierpoint.catalog.engine import Sessions
from tierpoint.catalog.stripe import pulling
from tierpoint.catalog.stripe.encoding import staged_names
from tierpoint.catalog.tier_copy.stripe_damage import mark_stripes_damaged
from tierpoint.contract.integrity import Finding, TierReport
from tierpoint.states import ReplicaState
from tierpoint.storage.paths import is_partial_name
from tierpoint.storage.posix.staging import STAGING_DIR, StripeStaging
from tierpoint.storage.posix.store import PosixStore
from tierpoint.tier_config import TierConfig

Note = Callable[[TierReport, Finding, str], None]
# Asks for the rebuild of those of the checkpoints whose coded copy on the tier has stripes found
# bad (`activities/scrub.py: ScrubActivities.ask_rebuild`), after the commit.
AskRebuild = Callable[[str, Iterable[int]], None]

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


@dataclass(frozen=True)
class _JobScan:
    """One job's files of a coded tier on a node, against the catalog's, reported on `report`:
    temp files of ours older than `grace` are abandoned (removed with `repair`, which also records
    damaged held stripes)."""

    sessions: Sessions
    tier: TierConfig
    node: str
    job: str
    report: TierReport
    grace: float
    repair: bool
    note: Note
    ask_rebuild: AskRebuild

    def staged(self) -> None:
        """The stripes the node's encoder staged of `job`."""
        staging = StripeStaging(self.tier, self.node)
        indexes = _indexes(staging, self.report, self.note)
        if not indexes:
            return
        with self.sessions.begin() as s:
            known = staged_names(s, self.node, self.tier.name, self.job)
        for index in indexes:
            shown = f"{STAGING_DIR}/{index}/{self.job}"
            for rel, _size in self._committed_files(staging.store(index), shown):
                step_s, _, path = rel.partition("/")
                if (index, step_s, path) not in known:
                    self.note(self.report, Finding.EXTRA, f"{shown}/{rel}")

    def held(self) -> None:
        """The stripes of `job` the node holds for other nodes."""
        job, report, note = self.job, self.report, self.note
        with self.sessions.begin() as s:
            held = pulling.held_stripes(s, self.node, self.tier.name, job)
        store = StripeStaging(self.tier, self.node).holder_store()
        seen: set[tuple[str, str]] = set()
        wrong: list[tuple[int, int]] = []
        for rel, size in self._committed_files(store, job):
            step_s, _, path = rel.partition("/")
            stripe = held.get((step_s, path))
            if stripe is None:
                note(report, Finding.EXTRA, f"{job}/{rel}")
                continue
            seen.add((step_s, path))
            if stripe.state == ReplicaState.VERIFIED.value and size != stripe.size:
                note(report, Finding.WRONG_SIZE, f"{job}/{rel}: {size} != {stripe.size} bytes")
                wrong.append((stripe.shard_id, stripe.index))
        missing = []
        for key, stripe in sorted(held.items()):
            if stripe.state != ReplicaState.VERIFIED.value:
                continue
            report.checked += 1
            if key not in seen:
                note(report, Finding.MISSING, f"{job}/{key[0]}/{key[1]}")
                missing.append((stripe.shard_id, stripe.index))
        if self.repair and (missing or wrong):
            self._mark_bad(missing, wrong)
        if self.repair:
            # Committed: the rebuild cuts them again, as it does what the scrub finds. Read from
            # the catalog, so an attempt retried after a failed ask (its stripes no longer
            # verified, so not found again) asks again.
            with self.sessions.begin() as s:
                bad = pulling.found_bad_on(s, self.node, self.tier.name, job)
            # guard: reconcile-asks-rebuild-of-bad-stripes
            self.ask_rebuild(self.tier.name, bad)

    def _mark_bad(self, missing: list[tuple[int, int]], wrong: list[tuple[int, int]]) -> None:
        code = self.tier.stripe_code
        if code is None:
            return
        # Through the one path that fails the coded copy once a set is left below k.
        with self.sessions.begin() as s:
            for keys, state, why in (
                (missing, ReplicaState.LOST, f"missing on {self.tier.name}"),
                (wrong, ReplicaState.CORRUPT, "wrong size"),
            ):
                damage = mark_stripes_damaged(
                    s, self.tier.name, code, dict.fromkeys(keys, why), state, "reconcile"
                )
                self.report.marked += damage.marked

    def _committed_files(self, store: PosixStore, shown: str) -> Iterator[tuple[str, int]]:
        """The files under `job`'s directory of `store` (`shown` in findings), relative to it,
        each counted scanned, with their sizes. A temp file of ours is not one of them: older
        than `grace` it is reported abandoned, and removed with `repair`."""
        top = store.root / self.job
        if os.path.islink(top) or not top.is_dir():
            return
        for rel, size, mtime in walk(top):
            self.report.scanned += 1
            if is_partial_name(rel.rsplit("/", 1)[-1]):
                if mtime < self.grace:
                    self.note(self.report, Finding.ABANDONED_TEMP, f"{shown}/{rel}")
                    if self.repair:
                        self.report.cleaned += int(store.remove_temp(self.job, rel))
                continue
            yield rel, size


def scan_coded_job(
    sessions: Sessions,
    tier: TierConfig,
    node: str,
    job: str,
    report: TierReport,
    grace: float,
    repair: bool,
    note: Note,
    ask_rebuild: AskRebuild,
) -> None:
    """A coded tier's files of `job` on `node`: the stripes it holds, and those it staged."""
    scan = _JobScan(sessions, tier, node, job, report, grace, repair, note, ask_rebuild)
    scan.held()
    scan.staged()
