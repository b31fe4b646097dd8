"""Reconciliation: list what is really on a tier (a POSIX root, per node for a local or peer
tier, or a bucket prefix) and compare it with the catalog, job by job.

Reported: verified replicas whose file/object is missing or has the wrong size, files/objects that
no shard of the catalog names (never deleted: the catalog does not know what they are), and temp
files / multipart uploads older than the grace period (abandoned copies). With `repair`, missing
replicas become `lost` and wrong-sized ones `corrupt` (their tier copies demoted in the same
transaction, `tierpoint/catalog/tier_copy/damage.py`), and the abandoned temp files and uploads are
removed; the workflow then asks for the repair of the damaged checkpoints.

One activity per unit, heartbeating the index of the job it is at, so a retry resumes there.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from temporalio import activity

from tierpoint import logs
from tierpoint.catalog.engine import Sessions
from tierpoint.catalog.job import lookup
from tierpoint.catalog.node import registry
from tierpoint.catalog.replica import reconcile
from tierpoint.catalog.tier_copy.damage import mark_damaged
from tierpoint.config import Settings
from tierpoint.contract.integrity import (
    RECONCILE_PLAN,
    RECONCILE_SCAN,
    REPORT_EXAMPLES,
    Finding,
    ReconcileInput,
    ReconcilePlan,
    ReconcileScanInput,
    ReconcileUnit,
    TierReport,
)
from tierpoint.services import stripe_rebuild
from tierpoint.states import ReplicaState
from tierpoint.storage.paths import is_partial_name, parse_step_dir
from tierpoint.storage.posix.staging import STAGING_DIR
from tierpoint.storage.posix.store import PosixStore
from tierpoint.storage.s3.layout import is_spread_dir
from tierpoint.storage.s3.store import S3Store
from tierpoint.tier_config import TierConfig, TierKind

from . import reconcile_staging
from .reconcile_staging import Entry, walk
from .registration import on_node_queue
from .stores import Stores, ensure_reachable

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

log = logs.get(__name__)

# Entries listed between heartbeats (one S3 page).
HEARTBEAT_EVERY = 1000


def _note(report: TierReport, finding: Finding, what: str) -> None:
    report.counts[finding.value] = report.counts.get(finding.value, 0) + 1
    examples = report.examples.setdefault(finding.value, [])
    if len(examples) < REPORT_EXAMPLES:
        examples.append(what)


class ReconcileActivities:
    def __init__(
        self,
        sessions: Sessions,
        settings: Settings,
        stores: Stores,
        node: str | None = None,
        rebuilds: stripe_rebuild.RebuildRequests | None = None,
    ) -> None:
        self._sessions = sessions
        self._settings = settings
        self._stores = stores
        self._node = node
        self._rebuilds = rebuilds

    def _ask_rebuild(self, tier: str, checkpoint_ids: Iterable[int]) -> None:
        stripe_rebuild.ask_due(self._sessions, self._rebuilds, tier, checkpoint_ids)

    @activity.defn(name=RECONCILE_PLAN)
    def plan(self, inp: ReconcileInput) -> ReconcilePlan:
        tiers = [self._settings.tier(inp.tier)] if inp.tier else self._settings.tiers
        with self._sessions.begin() as s:
            nodes = registry.serving_nodes(s)
        units = []
        for t in tiers:
            # A peer tier's root on a node holds the copies that node keeps for others (their
            # replicas name it): scanned there, as a local root is.
            for node in nodes if t.on_nodes else [None]:
                units.append(ReconcileUnit(tier=t.name, kind=t.kind, node=node))
        grace = self._settings.reconcile_grace / timedelta(seconds=1)
        return ReconcilePlan(units=units, grace_seconds=grace)

    @on_node_queue
    @activity.defn(name=RECONCILE_SCAN)
    def scan(self, inp: ReconcileScanInput) -> TierReport:
        tier = self._stores.tier(inp.unit.tier)
        node = inp.unit.node
        ensure_reachable(tier, node, self._node)
        report = TierReport(tier=tier.name, node=node)
        grace = time.time() - inp.grace_seconds
        with self._sessions.begin() as s:
            jobs = lookup.job_names(s, only=inp.job)
        staging = tier.stripe_code is not None and node is not None
        if tier.kind is TierKind.S3:
            lister: _Lister = _S3Lister(self._stores, tier, inp.repair)
        else:
            store = self._stores.get(tier, node)
            assert isinstance(store, PosixStore)
            lister = _PosixLister(store)
        if inp.job is None:
            for name in lister.top_level():
                # A coded tier's staging area is scanned job by job with the jobs' own.
                if name not in jobs and not (staging and name == STAGING_DIR):
                    _note(report, Finding.EXTRA, f"{name} (not a job of the catalog)")
        details = activity.info().heartbeat_details
        start = int(details[-1]) if details else 0
        for i, job in enumerate(jobs):
            if i < start:
                continue
            activity.heartbeat(i)
            if staging:
                assert node is not None
                # A coded tier holds stripes, never replicas: they are the stripe table's.
                reconcile_staging.scan_coded_job(
                    self._sessions,
                    tier,
                    node,
                    job,
                    report,
                    grace,
                    inp.repair,
                    _note,
                    self._ask_rebuild,
                )
            else:
                self._job(report, lister, tier, node, job, grace, inp.repair, i)
        report.cleaned += lister.abandoned_uploads(report, inp.job, grace)
        return report

    def _job(
        self,
        report: TierReport,
        lister: _Lister,
        tier: TierConfig,
        node: str | None,
        job: str,
        grace: float,
        repair: bool,
        index: int,
    ) -> None:
        with self._sessions.begin() as s:
            expected = reconcile.job_on_tier(
                s,
                job,
                tier.name,
                node if tier.kind is TierKind.LOCAL else None,
                holder=node if tier.kind is TierKind.PEER else None,
            )
        seen: set[tuple[str, str]] = set()
        wrong: dict[int, str] = {}
        for n, (rel, size, mtime) in enumerate(lister.entries(job), 1):
            report.scanned += 1
            if n % HEARTBEAT_EVERY == 0:
                activity.heartbeat(index)
            step_s, _, path = rel.partition("/")
            name = rel.rsplit("/", 1)[-1]
            if is_partial_name(name):
                if mtime < grace:
                    _note(report, Finding.ABANDONED_TEMP, f"{job}/{rel}")
                    if repair:
                        report.cleaned += lister.remove_temp(job, rel)
                continue
            key = (step_s, path) if _is_step_dir(step_s) and path else None
            exp = expected.get(key) if key is not None else None
            if exp is None or key is None:
                _note(report, Finding.EXTRA, f"{job}/{rel}")
                continue
            seen.add(key)
            if exp.replica_state == ReplicaState.VERIFIED and size != exp.shard_size:
                _note(report, Finding.WRONG_SIZE, f"{job}/{rel}: {size} != {exp.shard_size} bytes")
                assert exp.replica_id is not None
                wrong[exp.replica_id] = f"reconcile: size {size} != registered {exp.shard_size}"
        missing: dict[int, str] = {}
        for key, exp in sorted(expected.items()):
            if exp.replica_state != ReplicaState.VERIFIED:
                continue
            report.checked += 1
            if key not in seen:
                _note(report, Finding.MISSING, f"{job}/{key[0]}/{key[1]}")
                assert exp.replica_id is not None
                missing[exp.replica_id] = f"reconcile: missing on {tier.name}"
        if repair and (missing or wrong):
            with self._sessions.begin() as s:
                lost = mark_damaged(s, missing, ReplicaState.LOST, "reconcile")
                bad = mark_damaged(s, wrong, ReplicaState.CORRUPT, "reconcile")
            report.marked += lost.marked + bad.marked
            report.damaged = sorted(set(report.damaged) | lost.checkpoints | bad.checkpoints)


class _Lister:
    def top_level(self) -> list[str]:
        raise NotImplementedError

    def entries(self, job: str) -> Iterator[Entry]:
        raise NotImplementedError

    def remove_temp(self, job: str, rel: str) -> int:
        return 0

    def abandoned_uploads(self, report: TierReport, job: str | None, grace: float) -> int:
        return 0


class _PosixLister(_Lister):
    def __init__(self, store: PosixStore) -> None:
        self.store = store
        self.root = store.root

    def top_level(self) -> list[str]:
        try:
            return sorted(os.listdir(self.root))
        except FileNotFoundError:
            return []

    def entries(self, job: str) -> Iterator[Entry]:
        top = self.root / job
        if os.path.islink(top) or not top.is_dir():
            return iter(())
        return walk(top)

    def remove_temp(self, job: str, rel: str) -> int:
        return int(self.store.remove_temp(job, rel))


class _S3Lister(_Lister):
    def __init__(self, stores: Stores, tier: TierConfig, repair: bool) -> None:
        store = stores.get(tier, None)
        assert isinstance(store, S3Store)
        self.client: S3Client = store.client
        self.bucket = store.bucket
        self.prefix = store.prefix
        self.uploads = store.uploads
        self.repair = repair
        self._spread: list[str] | None = None

    def _list(self, prefix: str) -> tuple[list[str], list[str]]:
        """(sub-prefixes, object names) directly under `prefix`, relative to it."""
        dirs: list[str] = []
        names: list[str] = []
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix, Delimiter="/"):
            dirs.extend(
                p["Prefix"][len(prefix) :].rstrip("/") for p in page.get("CommonPrefixes", [])
            )
            names.extend(o["Key"][len(prefix) :] for o in page.get("Contents", []))
        return dirs, names

    def _tops(self) -> list[str]:
        """Where jobs' keys start: the tier prefix (flat layout) and each spread layout's
        directory under it (`_<h>/`, tierpoint/storage/s3/layout.py)."""
        if self._spread is None:
            dirs, _ = self._list(self.prefix)
            self._spread = [f"{self.prefix}{d}/" for d in dirs if is_spread_dir(d)]
        return [self.prefix, *self._spread]

    def top_level(self) -> list[str]:
        dirs, names = self._list(self.prefix)
        names += [d for d in dirs if not is_spread_dir(d)]
        for top in self._tops()[1:]:
            jobs, objects = self._list(top)
            names += [*jobs, *(top[len(self.prefix) :] + o for o in objects)]
        return sorted(set(names))

    def entries(self, job: str) -> Iterator[Entry]:
        paginator = self.client.get_paginator("list_objects_v2")
        for top in (f"{t}{job}/" for t in self._tops()):
            for page in paginator.paginate(Bucket=self.bucket, Prefix=top):
                for o in page.get("Contents", []):
                    yield o["Key"][len(top) :], int(o["Size"]), o["LastModified"].timestamp()

    def abandoned_uploads(self, report: TierReport, job: str | None, grace: float) -> int:
        prefixes = [f"{t}{job}/" for t in self._tops()] if job else [self.prefix]
        cutoff = datetime.fromtimestamp(grace, UTC)
        cleaned = 0
        paginator = self.client.get_paginator("list_multipart_uploads")
        pages = (p for x in prefixes for p in paginator.paginate(Bucket=self.bucket, Prefix=x))
        for page in pages:
            for u in page.get("Uploads", []):
                initiated: Any = u.get("Initiated")
                if initiated is None or initiated >= cutoff:
                    continue
                _note(report, Finding.ABANDONED_UPLOAD, f"{u['Key']} (upload {u['UploadId']})")
                if self.repair:
                    self.uploads.abort(u["Key"], u["UploadId"])
                    cleaned += 1
        return cleaned


def _is_step_dir(name: str) -> bool:
    """A checkpoint's directory: `<step>`, or `<step>.b<branch>` on a later branch."""
    try:
        parse_step_dir(name)
    except ValueError:
        return False
    return True
