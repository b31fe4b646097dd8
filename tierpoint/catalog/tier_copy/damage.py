"""Replicas found bad (a scrub's read, a reconciliation's listing, a reader's report, a copy that
read its source and got other bytes than were registered): the one place that marks them `corrupt`
or `lost` and, in the same transaction, takes their tier copy out of `restorable`, so "latest
restorable" stops offering a copy the moment it is known bad.

A tier copy demoted here becomes `failed` with a reason that names the damage: retention plans
expiries of `restorable` copies only, so a damaged copy is never deleted as if it were good, and
the planner goes on protecting the checkpoint's remaining good copies (invariant 2). Repair
(`tierpoint/catalog/tier_copy/repair.py`) promotes it again once every shard is verified there.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import cast

from sqlalchemy import Table, select
from sqlalchemy.orm import Session

from tierpoint.catalog.events import EventKind, record
from tierpoint.catalog.locks import Locked, LockedReplica, lock_in_order
from tierpoint.catalog.models import Checkpoint, Replica, Shard
from tierpoint.catalog.replica.machine import mark_bad
from tierpoint.catalog.tier_copy.machine import Move, move
from tierpoint.states import ReplicaState

EXAMPLES = 3

_replica_table = cast(Table, Replica.__table__)


@dataclass
class Damage:
    """What one call changed."""

    marked: int = 0
    # checkpoint id -> tiers whose tier copy left `restorable`
    demoted: dict[int, list[str]] = field(default_factory=dict)
    checkpoints: set[int] = field(default_factory=set)


def mark_damaged(
    session: Session,
    problems: Mapping[int, str],
    state: ReplicaState,
    actor: str,
) -> Damage:
    """Mark the replicas (id -> reason) `state` (corrupt or lost) if they are still `verified`,
    and demote their tiers' tier copies, in the caller's transaction. Idempotent: a replica already
    marked is left as it is and counts for nothing."""
    assert state in (ReplicaState.CORRUPT, ReplicaState.LOST)
    out = Damage()
    if not problems:
        return out
    locked, marked = _lock_and_mark(session, problems, state)
    if not marked:
        return out
    by_pair: dict[tuple[int, str], list[tuple[int, int]]] = defaultdict(list)
    for m in marked:
        by_pair[(m.checkpoint_id, m.tier)].append((m.id, m.shard_id))
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
        demoted = _demote(session, locked, cid, tier, reason)
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
) -> tuple[Locked, list[LockedReplica]]:
    """The replicas of `problems` that were still verified, now marked `state`, with what was
    locked: their tier copies first, then the replicas, so a promotion counting verified replicas
    waits for this transaction and can never count a replica this call is marking bad."""
    candidates = session.execute(
        select(Replica.checkpoint_id, Replica.tier)
        .where(Replica.id.in_(list(problems)), Replica.state == ReplicaState.VERIFIED.value)
        .distinct()
    ).all()
    if not candidates:
        return Locked(), []
    locked = lock_in_order(
        session,
        tier_copies=[(c, t) for c, t in candidates],
        replicas=list(problems),
        replicas_in=ReplicaState.VERIFIED.value,
    )
    marked = list(locked.replicas.values())
    mark_bad(session, locked, {m.id: problems[m.id] for m in marked}, state)
    return locked, marked


def _demote(session: Session, locked: Locked, checkpoint_id: int, tier: str, reason: str) -> bool:
    """The tier copy out of `restorable` (to `failed`, with the reason); whether it was."""
    # guard: damage-keeps-tier-copy-restorable
    return bool(move(session, locked, Move.DAMAGED, [(checkpoint_id, tier)], reason=reason))


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
