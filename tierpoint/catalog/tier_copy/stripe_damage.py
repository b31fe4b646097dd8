"""Stripes of a coded peer tier found bad (a holder's scrub read one back wrong or not at all,
a reader's stripe whose bytes did not match and that a holder's read confirmed): the one place
that moves them `found bad` and, in the same transaction, takes their coded copy out of
`restorable` once some shard keeps fewer than k verified stripes, as `damage.py` does for a
replica. Above k the copy stays what a restore reads (any k stripes give a file back), and the
stripe no longer counts: `coverage` counts verified stripes only.

The tier copies are locked before the stripes move, in the catalog's order (as `promote` locks
them before it counts stripes), so no promotion counts a stripe being marked bad here.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

from sqlalchemy import select, tuple_
from sqlalchemy.orm import Session
from tierpoint_client.erasure import Code

from tierpoint.catalog.events import EventKind, record
from tierpoint.catalog.locks import Locked, lock_in_order
from tierpoint.catalog.models import Checkpoint, Shard, Stripe
from tierpoint.catalog.stripe import machine
from tierpoint.catalog.stripe.coverage import coverage, verified_stripes
from tierpoint.catalog.tier_copy.damage import EXAMPLES, Damage
from tierpoint.catalog.tier_copy.machine import Move, move
from tierpoint.states import ReplicaState, TierState


def mark_stripes_damaged(
    session: Session,
    tier: str,
    code: Code,
    problems: Mapping[tuple[int, int], str],
    state: ReplicaState,
    actor: str,
) -> Damage:
    """Move the stripes ((shard id, stripe index) -> reason) of `tier` `found bad` (corrupt or
    lost) if they are still verified, and fail each restorable coded copy of theirs left below
    k in some set, in the caller's transaction. Idempotent: a stripe already moved counts for
    nothing."""
    out = Damage()
    if not problems:
        return out
    rows = session.execute(
        select(Stripe.checkpoint_id, Stripe.shard_id, Stripe.stripe_index)
        .where(
            tuple_(Stripe.shard_id, Stripe.stripe_index).in_(list(problems)),
            Stripe.tier == tier,
            Stripe.state == ReplicaState.VERIFIED.value,
        )
        .order_by(Stripe.shard_id, Stripe.stripe_index)
    ).all()
    if not rows:
        return out
    locked = lock_in_order(session, tier_copies={(r.checkpoint_id, tier) for r in rows})
    # checkpoint id -> the (shard id, index) of its stripes moved here
    marked: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for r in rows:
        key = (r.shard_id, r.stripe_index)
        # guard: stripe-found-bad-is-marked
        if machine.mark_bad(session, tier, [key], state, f"{actor}: {problems[key]}"):
            marked[r.checkpoint_id].append(key)
    paths = dict(
        session.execute(
            select(Shard.id, Shard.path).where(Shard.id.in_({r.shard_id for r in rows}))
        ).all()
    )
    jobs = dict(
        session.execute(
            select(Checkpoint.id, Checkpoint.job_id).where(Checkpoint.id.in_(set(marked)))
        ).all()
    )
    for cid, items in sorted(marked.items()):
        out.marked += len(items)
        out.checkpoints.add(cid)
        examples = [f"{paths[sid]} stripe {i} ({problems[sid, i]})" for sid, i in items[:EXAMPLES]]
        reason = f"{len(items)} stripe(s) {state.value} on {tier} (found by {actor}): " + (
            ", ".join(examples)
        )
        demoted = _demote_below_k(session, locked, cid, tier, code, reason)
        if demoted:
            out.demoted.setdefault(cid, []).append(tier)
        record(
            session,
            EventKind.CORRUPT if state is ReplicaState.CORRUPT else EventKind.LOST,
            checkpoint_id=cid,
            job_id=jobs.get(cid),
            tier=tier,
            actor=actor,
            detail={"stripes": len(items), "examples": examples, "marker_demoted": demoted},
        )
    return out


def _demote_below_k(
    session: Session,
    locked: Locked,
    checkpoint_id: int,
    tier: str,
    code: Code,
    reason: str,
) -> bool:
    """The coded copy out of `restorable` (to `failed`) if some set now decodes no more; whether
    it was. A pending copy is left to its promotion, which needs every set whole."""
    copy = locked.tier_copies.get((checkpoint_id, tier))
    if copy is None or copy.state != TierState.RESTORABLE.value:
        return False
    # guard: stripe-damage-fails-copy-below-k
    if coverage(code, verified_stripes(session, checkpoint_id, tier)).restorable:
        return False
    return bool(move(session, locked, Move.DAMAGED, [(checkpoint_id, tier)], reason=reason))
