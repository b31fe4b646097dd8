"""The latest checkpoint a caller can restore, its restore plan (the fastest verified source of
every shard), and why each newer step was not chosen.

Driven by the tier copies' index (job_id, state, tier, step DESC): one index range scan per
candidate tier, so it stays O(log n) as a job's history grows. Reads only; the caller may ask
for the chosen checkpoint's row to be locked (to take a restore lease in the same transaction).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from sqlalchemy import exists, func, select, tuple_, union_all
from sqlalchemy.orm import Session

from tierpoint.catalog.job.lookup import job_id_by_name
from tierpoint.catalog.locks import lock_checkpoint
from tierpoint.catalog.models import (
    RESTORABLE,
    VERIFIED,
    Checkpoint,
    Replica,
    Shard,
    TierCopy,
)
from tierpoint.catalog.node import registry
from tierpoint.catalog.reads.checkpoints import checkpoint_view
from tierpoint.catalog.reads.views import (
    LatestRestorableView,
    RestorePlanEntry,
    SkippedStep,
)
from tierpoint.errors import NoRestorableCheckpoint
from tierpoint.states import ReplicaState, TierState
from tierpoint.storage.s3.layout import KeyLayout, s3_object
from tierpoint.tier_config import TierConfig, TierKind

NOT_VERIFIED = [s.value for s in ReplicaState if s is not ReplicaState.VERIFIED]

# How many checkpoints newer than the chosen one are examined to explain why they were skipped.
SKIPPED_LIMIT = 100


def _candidate_query(
    job_id: int,
    source: TierConfig,
    node: str | None,
    below: int | None,
    scan_limit: int,
) -> Any:
    """The newest checkpoint restorable from `source` for the caller, with a step below
    `below`. Only the newest `scan_limit` restorable tier copies are examined (one range of
    the (job_id, state, tier, step DESC) index), so the cost does not grow with the history."""
    ct = TierCopy
    tier_copies = (
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
        tier_copies = tier_copies.where(ct.step < below)
    m = tier_copies.subquery()
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


def _plan(
    session: Session,
    job: str,
    step: int,
    checkpoint_id: int,
    sources: Sequence[TierConfig],
    node: str | None,
) -> list[RestorePlanEntry] | None:
    """For each shard the fastest verified source among the tiers restorable for this checkpoint:
    a local replica on the caller's node, else the first restorable non-local tier. None if some
    shard has no such source (the catalog disagrees with its tier copies)."""
    tier_copies = {
        m.tier: m
        for m in session.execute(
            select(
                TierCopy.tier,
                TierCopy.state,
                TierCopy.quarantine_reason,
                TierCopy.key_layout,
            ).where(TierCopy.checkpoint_id == checkpoint_id)
        )
    }
    usable = [
        t
        for t in sources
        if (m := tier_copies.get(t.name)) is not None
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
    for r in session.execute(replica_q):
        located[(r.shard_id, r.tier)] = (r.location, r.node_id)
    peers = {t.name for t in usable if t.kind is TierKind.PEER}
    urls = registry.data_urls(
        session, {n for (_, t), (_, n) in located.items() if t in peers and n is not None}
    )
    shards = session.execute(
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
            url = registry.peer_url(t, urls, hit[1], job, step, s.path)
            if t.kind is TierKind.PEER and url is None:
                continue  # its holder serves no endpoint now
            layout = KeyLayout.parse(tier_copies[t.name].key_layout)
            bucket, key = s3_object(t, layout, job, step, s.path)
            plan.append(
                RestorePlanEntry(
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
            )
            break
        else:
            return None
    return plan


def _tier_reason(
    t: TierConfig,
    tier_copy: Any,
    counts: dict[str, int],
    shard_count: int,
    nodes: list[str],
    node: str | None,
) -> str:
    name = t.name
    if tier_copy is None:
        return f"{name}: not copied to this tier"
    if tier_copy.quarantine_reason is not None:
        return f"{name}: quarantined: {tier_copy.quarantine_reason}"
    verified = counts.get(VERIFIED, 0)
    bad = {
        s: n
        for s, n in counts.items()
        if s not in (VERIFIED, ReplicaState.PENDING.value, ReplicaState.COPYING.value) and n
    }
    bad_text = "".join(f", {n} {s}" for s, n in sorted(bad.items()))
    if tier_copy.state == TierState.PENDING.value:
        started = verified + counts.get(ReplicaState.COPYING.value, 0)
        what = "copying" if started else "pending"
        return f"{name}: {what}, {verified}/{shard_count} shards verified{bad_text}"
    if tier_copy.state == TierState.FAILED.value:
        return f"{name}: failed: {tier_copy.reason or 'no reason recorded'}"
    if tier_copy.state != RESTORABLE:
        return f"{name}: {tier_copy.state}"
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


def _skipped(
    session: Session,
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
    rows = session.execute(q.order_by(Checkpoint.step.desc()).limit(limit + 1)).all()
    examined = rows[:limit]
    if not examined:
        return []
    ids = [r.id for r in examined]
    names = [t.name for t in explain]
    tier_copies: dict[tuple[int, str], Any] = {
        (m.checkpoint_id, m.tier): m
        for m in session.execute(
            select(
                TierCopy.checkpoint_id,
                TierCopy.tier,
                TierCopy.state,
                TierCopy.reason,
                TierCopy.quarantine_reason,
            ).where(TierCopy.checkpoint_id.in_(ids), TierCopy.tier.in_(names))
        )
    }
    counts: dict[tuple[int, str], dict[str, int]] = defaultdict(dict)
    if tier_copies:
        for c in session.execute(
            select(Replica.checkpoint_id, Replica.tier, Replica.state, func.count())
            .where(tuple_(Replica.checkpoint_id, Replica.tier).in_(list(tier_copies)))
            .group_by(Replica.checkpoint_id, Replica.tier, Replica.state)
        ):
            counts[(c[0], c[1])][c[2]] = int(c[3])
    local_restorable = [
        cid
        for (cid, tier), m in tier_copies.items()
        if m.state == RESTORABLE
        and any(t.name == tier and t.kind is TierKind.LOCAL for t in explain)
    ]
    nodes: dict[int, list[str]] = defaultdict(list)
    if local_restorable and node is not None:
        for n in session.execute(
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
                tier_copies.get((r.id, t.name)),
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


def latest_restorable(
    session: Session,
    job: str,
    tiers: Sequence[TierConfig],
    *,
    tier: str | None = None,
    node: str | None = None,
    skipped_limit: int = SKIPPED_LIMIT,
    lock: bool = False,
) -> LatestRestorableView:
    """The highest step the caller can restore, with a plan, and why each newer step was not
    chosen. `tiers` is the configured tier list (fastest first); `tier` restricts the sources
    (the caller validated it); node-local copies count only when `node` is given.

    With `lock`, the chosen checkpoint's row is locked (FOR UPDATE) before its plan is read, until
    the caller's transaction ends: retention locks the row too before it flips a tier copy to
    `expiring`, so a restore lease the caller inserts in this transaction keeps the returned plan
    restorable while the lease lives."""
    job_id = job_id_by_name(session, job)
    if job_id is None:
        raise NoRestorableCheckpoint(f"job {job!r} has no checkpoints", extra={"skipped": []})
    chosen = [t for t in tiers if t.name == tier] if tier is not None else list(tiers)
    sources = [t for t in chosen if t.kind is not TierKind.LOCAL or node is not None]
    # Tiers mentioned in the explanations: the sources, plus a hint about node-local copies.
    explain = chosen

    below: int | None = None
    for _ in range(skipped_limit):
        # Every source's candidate in one round trip (a trip costs more than these index probes):
        # the newest of them wins; a step is one checkpoint whichever tier found it.
        subs = [
            _candidate_query(job_id, source, node, below, skipped_limit).subquery()
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
            lock_checkpoint(session, best[1])
        plan = _plan(session, job, best[0], best[1], sources, node)
        if plan is not None:
            skipped = _skipped(session, job_id, best[0], sources, explain, node, skipped_limit)
            view = checkpoint_view(session, job, best[1], tiers)
            return LatestRestorableView(job, best[0], view, plan, skipped)
        below = best[0]

    skipped = _skipped(session, job_id, None, sources, explain, node, skipped_limit)
    where = f" on tier {tier!r}" if tier is not None else ""
    who = f" for node {node!r}" if node is not None else ""
    raise NoRestorableCheckpoint(
        f"job {job!r} has no checkpoint restorable{where}{who}", extra={"skipped": skipped}
    )
