"""Reads behind the checkpoint endpoints: one checkpoint, a page of them, the jobs, and the latest
checkpoint a caller can restore with its restore plan.

"Latest restorable" is driven by the checkpoint_tier markers index (job_id, state, tier, step
DESC): one index range scan per candidate tier, so it stays O(log n) as a job's history grows.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import and_, case, exists, func, select, tuple_
from sqlalchemy.ext.asyncio import AsyncSession

from tierpoint.catalog.leases_repo import LeaseView, insert_lease
from tierpoint.catalog.models import (
    Checkpoint,
    CheckpointTier,
    Job,
    Replica,
    ReplicaState,
    Shard,
    TierState,
)
from tierpoint.config import TierConfig, TierKind
from tierpoint.errors import CheckpointNotFound, JobNotFound, NoRestorableCheckpoint
from tierpoint.manifest import Manifest

# How many checkpoints newer than the chosen one are examined to explain why they were skipped.
SKIPPED_LIMIT = 100
VERIFIED = ReplicaState.VERIFIED.value
RESTORABLE = TierState.RESTORABLE.value
NOT_VERIFIED = [s.value for s in ReplicaState if s is not ReplicaState.VERIFIED]


@dataclass
class Progress:
    shards_total: int
    shards_verified: int
    bytes_total: int
    bytes_done: int


@dataclass
class TierView:
    tier: str
    kind: str | None  # None for a marker of a tier no longer configured
    state: str
    reason: str | None
    quarantine_reason: str | None
    restorable_at: datetime | None
    progress: Progress


@dataclass
class CheckpointView:
    id: int
    job: str
    step: int
    created_at: datetime
    metadata: dict[str, Any]
    pinned: bool
    quarantine_reason: str | None
    total_bytes: int
    shard_count: int
    workflow_started: bool
    tiers: list[TierView]


@dataclass
class ReplicaView:
    tier: str
    node: str | None
    state: str
    location: str
    bytes_done: int
    verified_at: datetime | None
    error: str | None


@dataclass
class ShardView:
    path: str
    size: int
    crc32c: str | None
    node: str
    replicas: list[ReplicaView] = field(default_factory=list)


@dataclass
class CheckpointDetail(CheckpointView):
    shards: list[ShardView] = field(default_factory=list)


@dataclass
class JobView:
    name: str
    created_at: datetime
    checkpoint_count: int
    latest_step: int | None


@dataclass
class PlanEntry:
    path: str
    size: int
    crc32c: str | None
    tier: str
    kind: str
    node: str | None
    location: str


@dataclass
class SkippedStep:
    step: int
    reasons: list[str]


@dataclass
class LeaseRequest:
    ttl_seconds: int
    holder: str | None
    actor: str


@dataclass
class LatestRestorable:
    job: str
    step: int
    checkpoint: CheckpointView
    plan: list[PlanEntry]
    skipped: list[SkippedStep]
    lease: LeaseView | None = None


# ---------------------------------------------------------------------------------------------
# Building checkpoint views


async def job_id_of(session: AsyncSession, job: str) -> int | None:
    return await session.scalar(select(Job.id).where(Job.name == job))


_CHECKPOINT_COLS = (
    Checkpoint.id,
    Checkpoint.step,
    Checkpoint.created_at,
    Checkpoint.meta,
    Checkpoint.pinned,
    Checkpoint.quarantine_reason,
    Checkpoint.total_bytes,
    Checkpoint.shard_count,
    Checkpoint.workflow_started_at,
)


async def _progress(
    session: AsyncSession, pairs: Sequence[tuple[int, str]]
) -> dict[tuple[int, str], tuple[int, int]]:
    """(checkpoint_id, tier) -> (shards verified, bytes done), read from replica rows through the
    (checkpoint_id, tier, state) index."""
    if not pairs:
        return {}
    done = case(
        (Replica.state == VERIFIED, Shard.size),
        (Replica.state == ReplicaState.COPYING.value, Replica.bytes_done),
        else_=0,
    )
    rows = await session.execute(
        select(
            Replica.checkpoint_id,
            Replica.tier,
            func.count().filter(Replica.state == VERIFIED),
            func.coalesce(func.sum(done), 0),
        )
        .join(Shard, Shard.id == Replica.shard_id)
        .where(tuple_(Replica.checkpoint_id, Replica.tier).in_(list(pairs)))
        .group_by(Replica.checkpoint_id, Replica.tier)
    )
    return {(r[0], r[1]): (int(r[2]), int(r[3])) for r in rows}


async def _views(
    session: AsyncSession, job: str, rows: Sequence[Any], tiers: Sequence[TierConfig]
) -> list[CheckpointView]:
    if not rows:
        return []
    ids = [r.id for r in rows]
    markers = (
        await session.execute(
            select(
                CheckpointTier.checkpoint_id,
                CheckpointTier.tier,
                CheckpointTier.state,
                CheckpointTier.reason,
                CheckpointTier.quarantine_reason,
                CheckpointTier.restorable_at,
            ).where(CheckpointTier.checkpoint_id.in_(ids))
        )
    ).all()
    by_checkpoint: dict[int, list[Any]] = defaultdict(list)
    for m in markers:
        by_checkpoint[m.checkpoint_id].append(m)
    # A restorable marker means every shard is verified there (invariant 1): no need to count.
    progress = await _progress(
        session, [(m.checkpoint_id, m.tier) for m in markers if m.state != RESTORABLE]
    )
    order = {t.name: i for i, t in enumerate(tiers)}
    kinds = {t.name: t.kind.value for t in tiers}
    views = []
    for r in rows:
        tier_views = []
        for m in sorted(by_checkpoint[r.id], key=lambda m: (order.get(m.tier, len(order)), m.tier)):
            if m.state == RESTORABLE:
                verified, done = r.shard_count, r.total_bytes
            else:
                verified, done = progress.get((r.id, m.tier), (0, 0))
            tier_views.append(
                TierView(
                    tier=m.tier,
                    kind=kinds.get(m.tier),
                    state=m.state,
                    reason=m.reason,
                    quarantine_reason=m.quarantine_reason,
                    restorable_at=m.restorable_at,
                    progress=Progress(r.shard_count, verified, r.total_bytes, done),
                )
            )
        views.append(
            CheckpointView(
                id=r.id,
                job=job,
                step=r.step,
                created_at=r.created_at,
                metadata=r.meta,
                pinned=r.pinned,
                quarantine_reason=r.quarantine_reason,
                total_bytes=r.total_bytes,
                shard_count=r.shard_count,
                workflow_started=r.workflow_started_at is not None,
                tiers=tier_views,
            )
        )
    return views


def registered_view(
    job: str,
    checkpoint_id: int,
    created_at: datetime,
    manifest: Manifest,
    tiers: Sequence[TierConfig],
) -> CheckpointView:
    """The view of a checkpoint just registered, without reading back what was just written:
    every tier pending, nothing copied yet."""
    total = manifest.total_bytes
    n = len(manifest.shards)
    return CheckpointView(
        id=checkpoint_id,
        job=job,
        step=manifest.step,
        created_at=created_at,
        metadata=manifest.metadata,
        pinned=False,
        quarantine_reason=None,
        total_bytes=total,
        shard_count=n,
        workflow_started=False,
        tiers=[
            TierView(
                t.name,
                t.kind.value,
                TierState.PENDING.value,
                None,
                None,
                None,
                Progress(n, 0, total, 0),
            )
            for t in tiers
        ],
    )


async def checkpoint_view(
    session: AsyncSession, job: str, checkpoint_id: int, tiers: Sequence[TierConfig]
) -> CheckpointView:
    rows = (
        await session.execute(select(*_CHECKPOINT_COLS).where(Checkpoint.id == checkpoint_id))
    ).all()
    return (await _views(session, job, rows, tiers))[0]


async def get_checkpoint(
    session: AsyncSession,
    job: str,
    step: int,
    tiers: Sequence[TierConfig],
    *,
    include_shards: bool = True,
) -> CheckpointDetail:
    rows = (
        await session.execute(
            select(*_CHECKPOINT_COLS)
            .join(Job, Job.id == Checkpoint.job_id)
            .where(Job.name == job, Checkpoint.step == step)
        )
    ).all()
    if not rows:
        raise CheckpointNotFound(f"job {job!r} has no checkpoint at step {step}")
    view = (await _views(session, job, rows, tiers))[0]
    detail = CheckpointDetail(**{f: getattr(view, f) for f in view.__dataclass_fields__})
    if not include_shards:
        return detail
    shards = (
        await session.execute(
            select(Shard.id, Shard.path, Shard.size, Shard.checksum, Shard.node_id)
            .where(Shard.checkpoint_id == view.id)
            .order_by(Shard.ordinal)
        )
    ).all()
    replicas: dict[int, list[ReplicaView]] = defaultdict(list)
    order = {t.name: i for i, t in enumerate(tiers)}
    for r in await session.execute(
        select(
            Replica.shard_id,
            Replica.tier,
            Replica.node_id,
            Replica.state,
            Replica.location,
            Replica.bytes_done,
            Replica.verified_at,
            Replica.error,
        ).where(Replica.checkpoint_id == view.id)
    ):
        replicas[r.shard_id].append(
            ReplicaView(
                r.tier, r.node_id, r.state, r.location, r.bytes_done, r.verified_at, r.error
            )
        )
    detail.shards = [
        ShardView(
            path=s.path,
            size=s.size,
            crc32c=s.checksum,
            node=s.node_id,
            replicas=sorted(replicas[s.id], key=lambda x: (order.get(x.tier, len(order)), x.tier)),
        )
        for s in shards
    ]
    return detail


async def list_checkpoints(
    session: AsyncSession,
    job: str,
    tiers: Sequence[TierConfig],
    *,
    tier: str | None = None,
    state: str | None = None,
    limit: int = 50,
    before_step: int | None = None,
) -> tuple[list[CheckpointView], int | None]:
    """A page of the job's checkpoints by step, newest first, and the step to continue below
    (keyset pagination), or None on the last page."""
    job_id = await job_id_of(session, job)
    if job_id is None:
        raise JobNotFound(f"no job named {job!r} has registered a checkpoint")
    if tier is not None and state is not None:
        # Driven by the markers index (job_id, state, tier, step DESC).
        q = (
            select(*_CHECKPOINT_COLS)
            .select_from(CheckpointTier)
            .join(Checkpoint, Checkpoint.id == CheckpointTier.checkpoint_id)
            .where(
                CheckpointTier.job_id == job_id,
                CheckpointTier.state == state,
                CheckpointTier.tier == tier,
            )
            .order_by(CheckpointTier.step.desc())
        )
        if before_step is not None:
            q = q.where(CheckpointTier.step < before_step)
    else:
        q = select(*_CHECKPOINT_COLS).where(Checkpoint.job_id == job_id)
        if tier is not None or state is not None:
            cond = [CheckpointTier.checkpoint_id == Checkpoint.id]
            if tier is not None:
                cond.append(CheckpointTier.tier == tier)
            if state is not None:
                cond.append(CheckpointTier.state == state)
            q = q.where(exists().where(and_(*cond)))
        if before_step is not None:
            q = q.where(Checkpoint.step < before_step)
        q = q.order_by(Checkpoint.step.desc())
    rows = (await session.execute(q.limit(limit + 1))).all()
    next_step = rows[limit - 1].step if len(rows) > limit else None
    return await _views(session, job, rows[:limit], tiers), next_step


async def list_jobs(
    session: AsyncSession, *, limit: int = 100, after_name: str | None = None
) -> tuple[list[JobView], str | None]:
    count = select(func.count()).where(Checkpoint.job_id == Job.id).correlate(Job).scalar_subquery()
    latest = (
        select(func.max(Checkpoint.step))
        .where(Checkpoint.job_id == Job.id)
        .correlate(Job)
        .scalar_subquery()
    )
    q = select(Job.name, Job.created_at, count.label("n"), latest.label("latest")).order_by(
        Job.name
    )
    if after_name is not None:
        q = q.where(Job.name > after_name)
    rows = (await session.execute(q.limit(limit + 1))).all()
    jobs = [JobView(r.name, r.created_at, r.n, r.latest) for r in rows[:limit]]
    return jobs, (rows[limit - 1].name if len(rows) > limit else None)


# ---------------------------------------------------------------------------------------------
# Latest restorable checkpoint and its restore plan


def _candidate_query(
    job_id: int,
    source: TierConfig,
    node: str | None,
    below: int | None,
    above: int | None,
    scan_limit: int,
) -> Any:
    """The newest checkpoint restorable from `source` for the caller, with a step in
    (above, below). Only the newest `scan_limit` restorable markers are examined (one range of
    the (job_id, state, tier, step DESC) index), so the cost does not grow with the history."""
    ct = CheckpointTier
    markers = (
        select(ct.step, ct.checkpoint_id)
        .where(
            ct.job_id == job_id,
            ct.state == RESTORABLE,
            ct.tier == source.name,
            ct.quarantine_reason.is_(None),
        )
        .order_by(ct.step.desc())
        .limit(scan_limit)
    )
    if below is not None:
        markers = markers.where(ct.step < below)
    if above is not None:
        markers = markers.where(ct.step > above)
    m = markers.subquery()
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


async def _plan(
    session: AsyncSession,
    checkpoint_id: int,
    sources: Sequence[TierConfig],
    node: str | None,
) -> list[PlanEntry] | None:
    """For each shard the fastest verified source among the tiers restorable for this checkpoint:
    a local replica on the caller's node, else the first restorable non-local tier. None if some
    shard has no such source (the catalog disagrees with its markers)."""
    markers = {
        m.tier: m
        for m in await session.execute(
            select(
                CheckpointTier.tier, CheckpointTier.state, CheckpointTier.quarantine_reason
            ).where(CheckpointTier.checkpoint_id == checkpoint_id)
        )
    }
    usable = [
        t
        for t in sources
        if (m := markers.get(t.name)) is not None
        and m.state == RESTORABLE
        and m.quarantine_reason is None
        and (t.kind is not TierKind.LOCAL or node is not None)
    ]
    if not usable:
        return None
    located: dict[tuple[int, str], tuple[str, str | None]] = {}
    replica_q = select(Replica.shard_id, Replica.tier, Replica.location, Replica.node_id).where(
        Replica.checkpoint_id == checkpoint_id,
        Replica.tier.in_([t.name for t in usable]),
        Replica.state == VERIFIED,
    )
    for r in await session.execute(replica_q):
        located[(r.shard_id, r.tier)] = (r.location, r.node_id)
    shards = await session.execute(
        select(Shard.id, Shard.path, Shard.size, Shard.checksum, Shard.node_id)
        .where(Shard.checkpoint_id == checkpoint_id)
        .order_by(Shard.ordinal)
    )
    plan = []
    for s in shards:
        for t in usable:
            if t.kind is TierKind.LOCAL and s.node_id != node:
                continue
            hit = located.get((s.id, t.name))
            if hit is None or (t.kind is TierKind.LOCAL and hit[1] != node):
                continue
            plan.append(PlanEntry(s.path, s.size, s.checksum, t.name, t.kind.value, hit[1], hit[0]))
            break
        else:
            return None
    return plan


def _tier_reason(
    t: TierConfig,
    marker: Any,
    counts: dict[str, int],
    shard_count: int,
    nodes: list[str],
    node: str | None,
) -> str:
    name = t.name
    if marker is None:
        return f"{name}: not copied to this tier"
    if marker.quarantine_reason is not None:
        return f"{name}: quarantined: {marker.quarantine_reason}"
    verified = counts.get(VERIFIED, 0)
    bad = {
        s: n
        for s, n in counts.items()
        if s not in (VERIFIED, ReplicaState.PENDING.value, ReplicaState.COPYING.value) and n
    }
    bad_text = "".join(f", {n} {s}" for s, n in sorted(bad.items()))
    if marker.state == TierState.PENDING.value:
        started = verified + counts.get(ReplicaState.COPYING.value, 0)
        what = "copying" if started else "pending"
        return f"{name}: {what}, {verified}/{shard_count} shards verified{bad_text}"
    if marker.state == TierState.FAILED.value:
        return f"{name}: failed: {marker.reason or 'no reason recorded'}"
    if marker.state != RESTORABLE:
        return f"{name}: {marker.state}"
    if t.kind is TierKind.LOCAL:
        if node is None:
            return f"{name}: node-local copy; pass node= to restore from it"
        if nodes and nodes != [node]:
            if node not in nodes:
                return f"{name}: only on nodes {', '.join(nodes)} (caller {node})"
            return f"{name}: spread over nodes {', '.join(nodes)}, not all on caller {node}"
    if bad:
        return f"{name}: restorable but{bad_text[1:]} replicas"
    if verified < shard_count:
        return (
            f"{name}: restorable but only {verified}/{shard_count} shards have a verified replica"
        )
    return f"{name}: became restorable while this request ran"


async def _skipped(
    session: AsyncSession,
    job_id: int,
    above: int | None,
    sources: Sequence[TierConfig],
    explain: Sequence[TierConfig],
    node: str | None,
    limit: int,
) -> list[SkippedStep]:
    q = select(Checkpoint.id, Checkpoint.step, Checkpoint.quarantine_reason, Checkpoint.shard_count)
    q = q.where(Checkpoint.job_id == job_id)
    if above is not None:
        q = q.where(Checkpoint.step > above)
    rows = (await session.execute(q.order_by(Checkpoint.step.desc()).limit(limit + 1))).all()
    examined = rows[:limit]
    if not examined:
        return []
    ids = [r.id for r in examined]
    names = [t.name for t in explain]
    markers: dict[tuple[int, str], Any] = {
        (m.checkpoint_id, m.tier): m
        for m in await session.execute(
            select(
                CheckpointTier.checkpoint_id,
                CheckpointTier.tier,
                CheckpointTier.state,
                CheckpointTier.reason,
                CheckpointTier.quarantine_reason,
            ).where(CheckpointTier.checkpoint_id.in_(ids), CheckpointTier.tier.in_(names))
        )
    }
    counts: dict[tuple[int, str], dict[str, int]] = defaultdict(dict)
    if markers:
        for c in await session.execute(
            select(Replica.checkpoint_id, Replica.tier, Replica.state, func.count())
            .where(tuple_(Replica.checkpoint_id, Replica.tier).in_(list(markers)))
            .group_by(Replica.checkpoint_id, Replica.tier, Replica.state)
        ):
            counts[(c[0], c[1])][c[2]] = int(c[3])
    local_restorable = [
        cid
        for (cid, tier), m in markers.items()
        if m.state == RESTORABLE
        and any(t.name == tier and t.kind is TierKind.LOCAL for t in explain)
    ]
    nodes: dict[int, list[str]] = defaultdict(list)
    if local_restorable and node is not None:
        for n in await session.execute(
            select(Shard.checkpoint_id, Shard.node_id)
            .where(Shard.checkpoint_id.in_(local_restorable))
            .distinct()
            .order_by(Shard.checkpoint_id, Shard.node_id)
        ):
            nodes[n.checkpoint_id].append(n.node_id)
    skipped = []
    for r in examined:
        if r.quarantine_reason is not None:
            skipped.append(SkippedStep(r.step, [f"quarantined: {r.quarantine_reason}"]))
            continue
        reasons = [
            _tier_reason(
                t,
                markers.get((r.id, t.name)),
                counts.get((r.id, t.name), {}),
                r.shard_count,
                nodes.get(r.id, []),
                node if t in sources else None,
            )
            for t in explain
        ]
        skipped.append(SkippedStep(r.step, reasons))
    if len(rows) > limit:
        cut = rows[limit].step
        skipped.append(
            SkippedStep(
                cut,
                [
                    f"not examined: only the {limit} newest checkpoints above the chosen one are "
                    f"explained; step {cut} and older ones were not"
                ],
            )
        )
    return skipped


async def latest_restorable(
    session: AsyncSession,
    job: str,
    tiers: Sequence[TierConfig],
    *,
    tier: str | None = None,
    node: str | None = None,
    skipped_limit: int = SKIPPED_LIMIT,
    lease: LeaseRequest | None = None,
) -> LatestRestorable:
    """The highest step the caller can restore, with a plan, and why each newer step was not
    chosen. `tiers` is the configured tier list (fastest first); `tier` restricts the sources
    (the caller validated it); node-local copies count only when `node` is given.

    With `lease`, the chosen checkpoint's row is locked before its plan is read and a restore lease
    is inserted in the same transaction (the caller commits): retention locks the row too before
    it flips a marker to `expiring`, so the plan returned stays restorable while the lease lives."""
    job_id = await job_id_of(session, job)
    if job_id is None:
        raise NoRestorableCheckpoint(f"job {job!r} has no checkpoints", extra={"skipped": []})
    chosen = [t for t in tiers if t.name == tier] if tier is not None else list(tiers)
    sources = [t for t in chosen if t.kind is not TierKind.LOCAL or node is not None]
    # Tiers mentioned in the explanations: the sources, plus a hint about node-local copies.
    explain = chosen

    below: int | None = None
    for _ in range(skipped_limit):
        best: tuple[int, int] | None = None
        # Durable tiers first: a node-local copy matters only if it is newer than their best.
        for source in sorted(sources, key=lambda t: t.kind is TierKind.LOCAL):
            floor = best[0] if best is not None else None
            query = _candidate_query(job_id, source, node, below, floor, skipped_limit)
            hit = (await session.execute(query)).first()
            if hit is not None and (best is None or hit.step > best[0]):
                best = (hit.step, hit.checkpoint_id)
        if best is None:
            break
        if lease is not None:
            # Waits for a retention flip in progress; the plan below then sees its outcome.
            await session.execute(
                select(Checkpoint.id).where(Checkpoint.id == best[1]).with_for_update()
            )
        plan = await _plan(session, best[1], sources, node)
        if plan is not None:
            skipped = await _skipped(
                session, job_id, best[0], sources, explain, node, skipped_limit
            )
            taken = None
            if lease is not None:
                taken = await insert_lease(
                    session,
                    best[1],
                    job_id,
                    job,
                    best[0],
                    lease.ttl_seconds,
                    lease.holder,
                    lease.actor,
                )
            view = await checkpoint_view(session, job, best[1], tiers)
            return LatestRestorable(job, best[0], view, plan, skipped, taken)
        below = best[0]

    skipped = await _skipped(session, job_id, None, sources, explain, node, skipped_limit)
    where = f" on tier {tier!r}" if tier is not None else ""
    who = f" for node {node!r}" if node is not None else ""
    raise NoRestorableCheckpoint(
        f"job {job!r} has no checkpoint restorable{where}{who}", extra={"skipped": skipped}
    )
