"""The latest checkpoint a caller can restore, its restore plan (the fastest verified source of
every shard), and why each newer step was not chosen.

Driven by the tier copies' index (job_id, state, tier, step DESC): one index range scan per
candidate tier, so it stays O(log n) as a job's history grows. Reads only; the caller may ask
for the chosen checkpoint's row to be locked (to take a restore lease in the same transaction).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, exists, or_, select, true, union_all
from sqlalchemy.engine import Row
from sqlalchemy.orm import Session

from tierpoint.catalog.job.lookup import job_id_by_name
from tierpoint.catalog.locks import LEASE_LOCK, lock_checkpoint
from tierpoint.catalog.models import (
    RESTORABLE,
    VERIFIED,
    Checkpoint,
    Job,
    Replica,
    Shard,
    TierCopy,
)
from tierpoint.catalog.node import registry
from tierpoint.catalog.reads.checkpoint_views import checkpoint_view
from tierpoint.catalog.reads.coded_plan import CodedCopy, coded_copies
from tierpoint.catalog.reads.skipped import skipped_above
from tierpoint.catalog.reads.views import (
    LatestRestorableView,
    RestorePlanEntry,
    SkippedStep,
)
from tierpoint.catalog.timeline.branches import branch_segments
from tierpoint.catalog.timeline.verdicts import GOOD
from tierpoint.errors import NoRestorableCheckpoint
from tierpoint.states import ReplicaState
from tierpoint.storage.s3.layout import KeyLayout, s3_object
from tierpoint.tier_config import TierConfig, TierKind

NOT_VERIFIED = [s.value for s in ReplicaState if s is not ReplicaState.VERIFIED]

# How many checkpoints newer than the chosen one are examined to explain why they were skipped.
SKIPPED_LIMIT = 100


@dataclass(frozen=True)
class Timeline:
    """Which checkpoints of a job a "latest" may answer: the job's timeline (no `segments`: the
    checkpoints no rollback superseded), or one branch's own (its `segments`: (branch, highest
    step taken from it), `branches.branch_segments`); with `good`, only those marked good."""

    segments: tuple[tuple[int, int | None], ...] | None = None
    good: bool = False

    def where(self) -> ColumnElement[bool]:
        if self.segments is None:
            cond: ColumnElement[bool] = Checkpoint.superseded_by.is_(None)
        else:
            cond = or_(
                *(
                    (Checkpoint.branch == b) & (true() if top is None else Checkpoint.step <= top)
                    for b, top in self.segments
                )
            )
        if self.good:
            cond = cond & (Checkpoint.health == GOOD)
        return cond


def _tier_copies(
    job_id: int, source: TierConfig, below: int | None, scan_limit: int, timeline: Timeline
) -> Any:
    """The newest restorable, unquarantined tier copies on `source` of the timeline's
    checkpoints, at most `scan_limit`. The plain timeline reads one range of the tier copies
    index (job_id, state, tier, superseded, step DESC); the known-good one walks the partial
    index of good checkpoints (job_id, step DESC); a branch's joins its checkpoints."""
    ct = TierCopy
    copy_ok = (ct.state == RESTORABLE) & (ct.tier == source.name) & ct.quarantine_reason.is_(None)
    if timeline.good and timeline.segments is None:
        q = (
            select(Checkpoint.step, Checkpoint.id.label("checkpoint_id"))
            .join(ct, (ct.checkpoint_id == Checkpoint.id) & copy_ok)
            .where(Checkpoint.job_id == job_id, timeline.where())
            .order_by(Checkpoint.step.desc())
        )
        if below is not None:
            q = q.where(Checkpoint.step < below)
        return q.limit(scan_limit)
    q = select(ct.step, ct.checkpoint_id).where(ct.job_id == job_id, copy_ok)
    if timeline.segments is None:
        # guard: latest-skips-superseded
        q = q.where(ct.superseded.is_(False))
    else:
        q = q.join(Checkpoint, Checkpoint.id == ct.checkpoint_id).where(timeline.where())
    if below is not None:
        q = q.where(ct.step < below)
    return q.order_by(ct.step.desc()).limit(scan_limit)


def _candidate_query(
    job_id: int,
    source: TierConfig,
    node: str | None,
    below: int | None,
    scan_limit: int,
    timeline: Timeline,
) -> Any:
    """The newest checkpoint of the timeline restorable from `source` for the caller, with a
    step below `below`. Only the newest `scan_limit` restorable tier copies are examined, so the
    cost does not grow with the history."""
    m = _tier_copies(job_id, source, below, scan_limit, timeline).subquery()
    # Spelled as IN (other states), not != verified: a few probes of the (checkpoint_id, tier,
    # state) index instead of a scan over every verified replica of the checkpoint.
    unverified = exists().where(
        Replica.checkpoint_id == m.c.checkpoint_id,
        Replica.tier == source.name,
        Replica.state.in_(NOT_VERIFIED),
    )
    q = (
        select(m.c.step, m.c.checkpoint_id)
        .join(Checkpoint, Checkpoint.id == m.c.checkpoint_id)
        # The timeline's filter was applied by the scan of `m` (`_tier_copies`).
        .where(Checkpoint.quarantine_reason.is_(None), ~unverified)
        .order_by(m.c.step.desc())
        .limit(1)
    )
    if source.kind is TierKind.LOCAL:
        # A node-local copy restores the checkpoint only if every shard lives on the caller's node.
        # Two probes of the (checkpoint_id, node_id, ordinal) index rather than a scan of them all.
        for elsewhere in (Shard.node_id < node, Shard.node_id > node):
            q = q.where(~exists().where(Shard.checkpoint_id == m.c.checkpoint_id, elsewhere))
    return q


def _plan(
    session: Session,
    job: str,
    step: int,
    checkpoint_id: int,
    sources: Sequence[TierConfig],
    node: str | None,
) -> list[RestorePlanEntry] | None:
    """For each shard the fastest verified source among the tiers restorable for this checkpoint:
    a local replica on the caller's node, else the first restorable non-local tier (a coded
    tier with its stripes, `coded_plan`). None if some shard has no such source (the catalog
    disagrees with its tier copies)."""
    layouts = _restorable_copies(session, checkpoint_id)
    usable = [
        t
        for t in sources
        if t.name in layouts and (t.kind is not TierKind.LOCAL or node is not None)
    ]
    if not usable:
        return None
    branch = session.scalar(select(Checkpoint.branch).where(Checkpoint.id == checkpoint_id)) or 1
    located = _verified_replicas(session, checkpoint_id, usable)
    peers = {t.name for t in usable if t.kind is TierKind.PEER}
    urls = registry.data_urls(
        session, {n for (_, t), (_, n) in located.items() if t in peers and n is not None}
    )
    shards = session.execute(
        select(Shard.id, Shard.path, Shard.size, Shard.checksum, Shard.node_id)
        .where(Shard.checkpoint_id == checkpoint_id)
        .order_by(Shard.ordinal)
    ).all()
    coded = coded_copies(
        session,
        checkpoint_id,
        [t for t in usable if t.stripe_code is not None],
        {s.id: s.path for s in shards},
        (job, step, branch),
    )
    # A coded copy short of k stripes for some shard is not offered: the next tier serves it.
    usable = [t for t in usable if t.stripe_code is None or t.name in coded]
    choice = _Sources(job, step, branch, node, usable, layouts, located, urls, coded)
    plan = []
    for s in shards:
        entry = choice.entry(s)
        if entry is None:
            return None
        plan.append(entry)
    return plan


def _restorable_copies(session: Session, checkpoint_id: int) -> dict[str, str | None]:
    """The checkpoint's restorable, unquarantined tier copies: tier -> its recorded key layout."""
    copies = select(TierCopy.tier, TierCopy.key_layout).where(
        TierCopy.checkpoint_id == checkpoint_id,
        TierCopy.state == RESTORABLE,
        TierCopy.quarantine_reason.is_(None),
    )
    return {m.tier: m.key_layout for m in session.execute(copies)}


def _verified_replicas(
    session: Session, checkpoint_id: int, tiers: Sequence[TierConfig]
) -> dict[tuple[int, str], tuple[str, str | None]]:
    """(shard id, tier) -> (location, node) of the checkpoint's verified replicas on `tiers`."""
    replica_q = select(Replica.shard_id, Replica.tier, Replica.location, Replica.node_id).where(
        Replica.checkpoint_id == checkpoint_id,
        Replica.tier.in_([t.name for t in tiers]),
        Replica.state == VERIFIED,
    )
    return {(r.shard_id, r.tier): (r.location, r.node_id) for r in session.execute(replica_q)}


# A shard as the plan reads it: id, path, size, checksum, node.
_ShardRow = Row[int, str, int, str | None, str]


@dataclass(frozen=True)
class _Sources:
    """What a restore plan chooses each shard's source from: the usable tiers, fastest first, with
    their key layouts, verified replicas, holders' data endpoints and coded copies."""

    job: str
    step: int
    branch: int
    node: str | None
    tiers: list[TierConfig]
    layouts: dict[str, str | None]
    located: dict[tuple[int, str], tuple[str, str | None]]
    urls: dict[str, str]
    coded: dict[str, CodedCopy]

    def entry(self, s: _ShardRow) -> RestorePlanEntry | None:
        """The shard's fastest source, or None if no usable tier has one."""
        for t in self.tiers:
            if t.kind is TierKind.LOCAL and s.node_id != self.node:
                continue
            if t.name in self.coded:
                stripes = self.coded[t.name][s.id]
                where = f"{t.stripe_code} stripes on {len(stripes)} holders"
                return RestorePlanEntry(
                    s.path,
                    s.size,
                    s.checksum,
                    t.name,
                    t.kind.value,
                    None,
                    where,
                    code=str(t.stripe_code),
                    stripes=stripes,
                )
            replica = self._replica(s, t)
            if replica is not None:
                return replica
        return None

    def _replica(self, s: _ShardRow, t: TierConfig) -> RestorePlanEntry | None:
        """The shard's verified replica on `t` as a source, if there is one the caller can read."""
        hit = self.located.get((s.id, t.name))
        if hit is None or (t.kind is TierKind.LOCAL and hit[1] != self.node):
            return None
        url = registry.peer_url(t, self.urls, hit[1], self.job, self.step, s.path, self.branch)
        if t.kind is TierKind.PEER and url is None:
            return None  # its holder serves no endpoint now
        layout = KeyLayout.parse(self.layouts[t.name])
        bucket, key = s3_object(t, layout, self.job, self.step, s.path, self.branch)
        return RestorePlanEntry(
            s.path,
            s.size,
            s.checksum,
            t.name,
            t.kind.value,
            hit[1],
            hit[0],
            bucket,
            key,
            url,
        )


def latest_restorable(
    session: Session,
    job: str,
    tiers: Sequence[TierConfig],
    *,
    tier: str | None = None,
    node: str | None = None,
    skipped_limit: int = SKIPPED_LIMIT,
    lock: bool = False,
    branch: int | None = None,
    good: bool = False,
) -> LatestRestorableView:
    """The highest step the caller can restore, with a plan, and why each newer step was not
    chosen. `tiers` is the configured tier list (fastest first); `tier` restricts the sources
    (the caller validated it); node-local copies count only when `node` is given. Only the job's
    timeline counts (never a superseded checkpoint), or with `branch` that branch's own; with
    `good`, only checkpoints marked good. A forked job with no restorable checkpoint of its own
    answers its fork parent (`fork_parent`).

    With `lock`, the chosen checkpoint's row is locked FOR KEY SHARE (the lease's lock,
    `holds/leases.py`) before its plan is read, until the caller's transaction ends: retention
    locks the row FOR UPDATE before it flips a tier copy to `expiring`, so a restore lease the
    caller inserts in this transaction keeps the returned plan restorable while the lease lives,
    and restores of one checkpoint do not wait for each other."""
    job_id = job_id_by_name(session, job)
    if job_id is None:
        raise NoRestorableCheckpoint(f"job {job!r} has no checkpoints", extra={"skipped": []})
    timeline = Timeline(
        None if branch is None else tuple(branch_segments(session, job_id, branch)), good
    )
    chosen = [t for t in tiers if t.name == tier] if tier is not None else list(tiers)
    sources = [t for t in chosen if t.kind is not TierKind.LOCAL or node is not None]
    # Tiers mentioned in the explanations: the sources, plus a hint about node-local copies.
    explain = chosen

    below: int | None = None
    for _ in range(skipped_limit):
        # Every source's candidate in one round trip (a trip costs more than these index probes):
        # the newest of them wins; a step is one checkpoint whichever tier found it.
        subs = [
            _candidate_query(job_id, source, node, below, skipped_limit, timeline).subquery()
            for source in sources
        ]
        if not subs:
            break
        found = union_all(*(select(c.c.step, c.c.checkpoint_id) for c in subs)).subquery()
        hit = (
            session.execute(
                select(found.c.step, found.c.checkpoint_id).order_by(found.c.step.desc()).limit(1)
            )
        ).first()
        if hit is None:
            break
        best = (hit.step, hit.checkpoint_id)
        if lock:
            # Waits for a retention flip in progress; the plan below then sees its outcome.
            # guard: restore-lease-waits-for-expiry
            lock_checkpoint(session, best[1], LEASE_LOCK)
        plan = _plan(session, job, best[0], best[1], sources, node)
        if plan is not None:
            skipped = skipped_above(
                session, job_id, best[0], sources, explain, node, skipped_limit, timeline
            )
            view = checkpoint_view(session, job, best[1], tiers)
            return LatestRestorableView(job, best[0], view, plan, skipped)
        below = best[0]

    skipped = skipped_above(session, job_id, None, sources, explain, node, skipped_limit, timeline)
    inherited = _fork_parent(session, job_id, tiers, sources, node, lock=lock, skipped=skipped)
    if inherited is not None and branch is None and not good:
        return inherited
    where = f" on tier {tier!r}" if tier is not None else ""
    who = f" for node {node!r}" if node is not None else ""
    which = "" if branch is None else f" on branch {branch}"
    health = " marked good" if good else ""
    raise NoRestorableCheckpoint(
        f"job {job!r} has no checkpoint{health} restorable{which}{where}{who}",
        extra={"skipped": skipped},
    )


def _fork_parent(
    session: Session,
    job_id: int,
    tiers: Sequence[TierConfig],
    sources: Sequence[TierConfig],
    node: str | None,
    *,
    lock: bool,
    skipped: list[SkippedStep],
) -> LatestRestorableView | None:
    """A forked job's first restore: the checkpoint it was forked from, read where it is (no
    copy made), when that is restorable for the caller and not quarantined."""
    parent = session.execute(
        select(Checkpoint.id, Checkpoint.step, Checkpoint.quarantine_reason, Job.name)
        .join(Job, Job.id == Checkpoint.job_id)
        .where(
            Checkpoint.id == select(Job.fork_parent_id).where(Job.id == job_id).scalar_subquery()
        )
    ).one_or_none()
    if parent is None or parent.quarantine_reason is not None:
        return None
    if lock:
        lock_checkpoint(session, parent.id)
    plan = _plan(session, parent.name, parent.step, parent.id, sources, node)
    if plan is None:
        return None
    view = checkpoint_view(session, parent.name, parent.id, tiers)
    return LatestRestorableView(parent.name, parent.step, view, plan, skipped, fork_parent=True)
