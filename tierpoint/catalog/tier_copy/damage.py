"""Replicas found bad (a scrub's read, a reconciliation's listing, a reader's report, a copy that
read its source and got other bytes than were registered): the one place that marks them `corrupt`
or `lost` and, in the same transaction, takes their tier's marker out of `restorable`, so "latest
restorable" stops offering a copy the moment it is known bad.

A marker demoted here becomes `failed` with a reason that names the damage: retention plans
expiries of `restorable` copies only, so a damaged copy is never deleted as if it were good, and
the planner goes on protecting the checkpoint's remaining good copies (invariant 2). Repair
(`tierpoint/catalog/repair_repo.py`) promotes it again once every shard is verified there.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from sqlalchemy import Table, and_, bindparam, func, or_, select, update
from sqlalchemy.orm import Session

from tierpoint.catalog.events import EventKind, record
from tierpoint.catalog.models import Checkpoint, Replica, Shard, TierCopy
from tierpoint.states import ReplicaState, TierState

EXAMPLES = 3

_replica_table = cast(Table, Replica.__table__)


@dataclass
class Damage:
    """What one call changed."""

    marked: int = 0
    # checkpoint id -> tiers whose marker left `restorable`
    demoted: dict[int, list[str]] = field(default_factory=dict)
    checkpoints: set[int] = field(default_factory=set)


def mark_damaged(
    session: Session,
    problems: Mapping[int, str],
    state: ReplicaState,
    actor: str,
) -> Damage:
    """Mark the replicas (id -> reason) `state` (corrupt or lost) if they are still `verified`,
    and demote their tiers' markers, in the caller's transaction. Idempotent: a replica already
    marked is left as it is and counts for nothing."""
    assert state in (ReplicaState.CORRUPT, ReplicaState.LOST)
    out = Damage()
    if not problems:
        return out
    marked = _lock_and_mark(session, problems, state)
    if not marked:
        return out
    by_pair: dict[tuple[int, str], list[tuple[int, int]]] = defaultdict(list)
    for rid, cid, tier, sid in marked:
        by_pair[(cid, tier)].append((rid, sid))
    out.marked = len(marked)
    paths = dict(
        session.execute(
            select(Shard.id, Shard.path).where(Shard.id.in_([m.shard_id for m in marked]))
        ).all()
    )
    jobs = dict(
        session.execute(
            select(Checkpoint.id, Checkpoint.job_id).where(
                Checkpoint.id.in_({c for c, _ in by_pair})
            )
        ).all()
    )
    for (cid, tier), items in sorted(by_pair.items()):
        examples = [f"{paths[sid]} ({problems[rid]})" for rid, sid in items[:EXAMPLES]]
        reason = f"{len(items)} shard(s) {state.value} on {tier} (found by {actor}): " + ", ".join(
            examples
        )
        demoted = _demote(session, cid, tier, reason)
        if demoted:
            out.demoted.setdefault(cid, []).append(tier)
        out.checkpoints.add(cid)
        record(
            session,
            EventKind.CORRUPT if state is ReplicaState.CORRUPT else EventKind.LOST,
            checkpoint_id=cid,
            job_id=jobs.get(cid),
            tier=tier,
            actor=actor,
            detail={"count": len(items), "examples": examples, "marker_demoted": demoted},
        )
    return out


def _lock_and_mark(
    session: Session, problems: Mapping[int, str], state: ReplicaState
) -> Sequence[Any]:
    """(id, checkpoint id, tier, shard id) of the replicas of `problems` that were still
    verified, now marked `state`: their markers locked first, then the replicas."""
    candidates = session.execute(
        select(Replica.checkpoint_id, Replica.tier)
        .where(Replica.id.in_(list(problems)), Replica.state == ReplicaState.VERIFIED.value)
        .distinct()
    ).all()
    if not candidates:
        return []
    pairs = sorted((c, t) for c, t in candidates)
    # Markers first, as promote does: a promotion counting verified replicas waits for this
    # transaction, so it can never count a replica this call is marking bad.
    session.execute(
        select(TierCopy.checkpoint_id)
        .where(or_(*(and_(TierCopy.checkpoint_id == c, TierCopy.tier == t) for c, t in pairs)))
        .order_by(TierCopy.checkpoint_id, TierCopy.tier)
        .with_for_update()
    ).all()
    marked = session.execute(
        select(Replica.id, Replica.checkpoint_id, Replica.tier, Replica.shard_id)
        .where(Replica.id.in_(list(problems)), Replica.state == ReplicaState.VERIFIED.value)
        .order_by(Replica.id)
        .with_for_update()
    ).all()
    if marked:
        session.connection().execute(
            update(_replica_table)
            .where(_replica_table.c.id == bindparam("rid"))
            # The last good read was of bytes that are gone now: the next copy starts afresh.
            .values(
                state=state.value, error=bindparam("err"), scrubbed_at=None, updated_at=func.now()
            ),
            [{"rid": m.id, "err": problems[m.id][:2000]} for m in marked],
        )
    return marked


def _demote(session: Session, checkpoint_id: int, tier: str, reason: str) -> bool:
    """The tier's marker out of `restorable` (to `failed`, with the reason); whether it was."""
    demoted = session.execute(
        update(TierCopy)
        .where(
            TierCopy.checkpoint_id == checkpoint_id,
            TierCopy.tier == tier,
            TierCopy.state == TierState.RESTORABLE.value,
        )
        # guard: damage-keeps-marker-restorable
        .values(state=TierState.FAILED.value, reason=reason, updated_at=func.now())
        .returning(TierCopy.tier)
    ).all()
    return bool(demoted)


def mark_damaged_shards(
    session: Session,
    tier: str,
    problems: Mapping[int, str],
    state: ReplicaState,
    actor: str,
) -> Damage:
    """`mark_damaged` for replicas named by shard id on one tier, as a copy names the source
    replicas it read."""
    if not problems:
        return Damage()
    ids = session.execute(
        select(Replica.shard_id, Replica.id).where(
            Replica.tier == tier, Replica.shard_id.in_(list(problems))
        )
    ).all()
    return mark_damaged(session, {rid: problems[sid] for sid, rid in ids}, state, actor)
