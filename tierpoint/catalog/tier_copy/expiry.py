"""Catalog side of executing retention: what to expire now, and the tier copy/replica transitions of
one expiry (restorable -> expiring, committed before any byte is deleted; expiring -> expired after
the bytes are gone).

Every function runs in the caller's transaction and is idempotent. `begin_expiries` decides again,
under row locks, with the same pure planner the dry run uses: a snapshot taken earlier (the plan
activity's) may be stale by then (a pin, a lease, a quarantine, a failed promotion elsewhere). It
takes a round's copies at once, so the whole job is planned again once a round, not once a copy.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime

from sqlalchemy import ColumnElement, and_, case, func, null, select, text
from sqlalchemy.orm import Session

from tierpoint.catalog.events import EventKind, record
from tierpoint.catalog.job.lookup import job_id_of_checkpoint
from tierpoint.catalog.locks import EVERY_TIER_COPY, Locked, RowLock, lock_in_order
from tierpoint.catalog.models import Event, Node, Replica, Shard, Stripe, TierCopy
from tierpoint.catalog.policy.assigned import policy_for_job
from tierpoint.catalog.policy.snapshot import take_snapshot
from tierpoint.catalog.replica import cached_copies
from tierpoint.catalog.replica.machine import Move as ReplicaMove
from tierpoint.catalog.replica.machine import expire
from tierpoint.catalog.stripe import machine as stripes
from tierpoint.catalog.tier_copy.machine import Move, move
from tierpoint.contract.retention import BeginResult, BeginState, ExpiryTask, RetentionPlanResult
from tierpoint.retention.models import Expiry, Keep, RetentionPlan
from tierpoint.retention.planner import plan
from tierpoint.retention.policy import TierRef
from tierpoint.states import TierState
from tierpoint.storage.base import RecordedCopy
from tierpoint.tier_config import TierKind

ACTOR = "retention"
KEPT_EXAMPLES = 10
# How long a finish waits for a delete of its copy still running before its attempt fails (and
# is retried): below the catalog activities' timeout, so attempts never pile up waiting.
FINISH_LOCK_WAIT_MS = 20_000
# The rule recorded for an expiry that an earlier run began and did not finish, when its
# `expiring` event cannot be found.
UNFINISHED_RULE = "unfinished"


# Tiers whose copies live on the nodes' own storage: deleted by each node's worker.
ON_NODES = (TierKind.LOCAL, TierKind.PEER)


def _local_nodes(session: Session, checkpoint_id: int, tier: str) -> tuple[str, ...]:
    """Nodes that may hold the copy: the shards' nodes, any node a replica or a stripe names
    and any node a reader kept files on (`cached_copies`), except nodes declared lost (their
    bytes are unreachable; their replicas are `lost` already)."""
    shard_nodes = select(Shard.node_id).where(Shard.checkpoint_id == checkpoint_id)
    replica_nodes = select(Replica.node_id).where(
        Replica.checkpoint_id == checkpoint_id,
        Replica.tier == tier,
        Replica.node_id.is_not(None),
    )
    cached_nodes = cached_copies.nodes_on(checkpoint_id, tier)
    # A coded tier's stripes are held on other nodes than the shards'.
    holders = select(Stripe.node_id).where(
        Stripe.checkpoint_id == checkpoint_id, Stripe.tier == tier
    )
    candidates = set(session.scalars(shard_nodes.union(replica_nodes, cached_nodes, holders)))
    lost = set(
        session.scalars(select(Node.id).where(Node.id.in_(candidates), Node.lost_at.is_not(None)))
    )
    return tuple(sorted(n for n in candidates - lost if n is not None))


def job_plan(session: Session, job: str, tiers: Sequence[TierRef], now: datetime) -> RetentionPlan:
    """The job's plan now, under its policy (raises JobNotFound, or ValidationError for a stored
    policy that does not validate: retention must not run on a policy it cannot read)."""
    assigned = policy_for_job(session, job)
    return plan(take_snapshot(session, job, tiers, now), assigned.policy, now)


def plan_expiries(
    session: Session, job: str, tiers: Sequence[TierRef], now: datetime, limit: int
) -> RetentionPlanResult:
    """At most `limit` expiries to run now: unfinished ones (`expiring`, an earlier run began
    them) first, then the plan's, in plan order (fastest tier first, oldest step first)."""
    assigned = policy_for_job(session, job)
    result = plan(take_snapshot(session, job, tiers, now), assigned.policy, now)
    kinds = {t.name: t.kind for t in tiers}
    wanted: list[tuple[int, int, str, int, str | None]] = [
        (u.checkpoint_id, u.step, u.tier, u.bytes, None) for u in result.unfinished
    ] + [(e.checkpoint_id, e.step, e.tier, e.bytes, e.rule.value) for e in result.expiries]
    tasks = [
        ExpiryTask(
            checkpoint_id=cid,
            step=step,
            tier=tier,
            kind=kinds[tier],
            bytes=nbytes,
            rule=rule,
            nodes=list(_local_nodes(session, cid, tier)) if kinds[tier] in ON_NODES else [],
        )
        for cid, step, tier, nbytes, rule in wanted[:limit]
    ]
    return RetentionPlanResult(
        tasks=tasks,
        more=len(wanted) > limit,
        policy=f"{assigned.name} v{assigned.version} ({assigned.source})",
    )


def _lock(session: Session, checkpoint_ids: Collection[int]) -> Locked:
    """Lock the checkpoint rows and all their tier copies, in the catalog's order (by id), until
    commit. The row lock serialises with pins and with lease inserts (their foreign key check
    takes KEY SHARE on the row); the tier copies' locks with promotions and quarantines of other
    tiers, which the re-check reads. A checkpoint that is gone is not in `checkpoints`."""
    return lock_in_order(
        session,
        checkpoints=sorted(set(checkpoint_ids)),
        # guard: recheck-row-lock
        checkpoint_lock=RowLock.UPDATE,
        tier_copies=EVERY_TIER_COPY,
    )


def _states(locked: Locked, checkpoint_id: int) -> dict[str, str]:
    return {tier: c.state for (cid, tier), c in locked.tier_copies.items() if cid == checkpoint_id}


def begin_expiry(
    session: Session,
    job: str,
    checkpoint_id: int,
    tier: str,
    tiers: Sequence[TierRef],
    now: datetime,
) -> BeginResult:
    """`begin_expiries` for one copy."""
    return begin_expiries(session, job, [(checkpoint_id, tier)], tiers, now)[0]


def begin_expiries(
    session: Session,
    job: str,
    copies: Sequence[tuple[int, str]],
    tiers: Sequence[TierRef],
    now: datetime,
) -> list[BeginResult]:
    """Move each tier copy (checkpoint id, tier) of the job and its replicas to `expiring` if
    retention still wants it gone, judged now under locks by the planner over a fresh snapshot;
    the results in the order of `copies`. Every checkpoint named is locked first, then the job
    is planned once for all of them: a pin, lease, quarantine or rebuild hold committed before
    the locks were taken is in the snapshot, and none can be taken on these checkpoints until
    the caller commits. One plan's expiries are safe together (the planner's properties), so the
    copies of a round need no plan each. The caller commits before it deletes a byte (invariant
    3). An `expiring` tier copy is an expiry begun earlier: it is continued, never turned back."""
    wanted = list(dict.fromkeys(copies))
    locked = _lock(session, [cid for cid, _ in wanted])
    kinds = {t.name: t.kind for t in tiers}
    judged: dict[tuple[int, str], BeginResult] = {}
    undecided: list[tuple[int, str]] = []
    for copy in wanted:
        if (result := _already(session, locked, copy, kinds)) is not None:
            judged[copy] = result
        else:
            undecided.append(copy)
    if undecided:
        fresh = job_plan(session, job, tiers, now)
        expiries = {(e.checkpoint_id, e.tier): e for e in fresh.expiries}
        keeps = {(k.checkpoint_id, k.tier): k for k in fresh.keeps}
        for copy in undecided:
            judged[copy] = _begin(session, locked, copy, expiries.get(copy), keeps.get(copy))
    return [judged[copy] for copy in copies]


def _already(
    session: Session, locked: Locked, copy: tuple[int, str], kinds: dict[str, TierKind]
) -> BeginResult | None:
    """What the copy's state alone decides, under its locks; None: the fresh plan decides."""
    checkpoint_id, tier = copy
    if checkpoint_id not in locked.checkpoints:
        return BeginResult(state=BeginState.SKIPPED, reason=f"checkpoint {checkpoint_id} is gone")
    state = _states(locked, checkpoint_id).get(tier)
    if state == TierState.EXPIRING.value:
        return BeginResult(
            state=BeginState.EXPIRING, rule=_begun_rule(session, checkpoint_id, tier)
        )
    if state == TierState.EXPIRED.value:
        return BeginResult(state=BeginState.EXPIRED)
    # A failed copy on a node tier is planned only when a lost node took part of it (the fresh
    # plan decides); any other failed copy is the operator's.
    if state != TierState.RESTORABLE.value and not (
        state == TierState.FAILED.value and kinds.get(tier) in ON_NODES
    ):
        return BeginResult(
            state=BeginState.SKIPPED, reason=f"the tier copy on {tier!r} is {state or 'missing'}"
        )
    return None


def _begin(
    session: Session,
    locked: Locked,
    copy: tuple[int, str],
    expiry: Expiry | None,
    keep: Keep | None,
) -> BeginResult:
    """Flip the copy to `expiring` if the fresh plan (`expiry`) still wants it gone."""
    checkpoint_id, tier = copy
    # guard: recheck-kept-now
    if expiry is None:
        why = ", ".join(keep.reasons) if keep is not None else "not planned any more"
        return BeginResult(state=BeginState.SKIPPED, reason=f"kept now: {why}")

    job_id = job_id_of_checkpoint(session, checkpoint_id)
    moved = [copy]
    move(session, locked, Move.EXPIRY_BEGUN, moved, reason=f"{expiry.rule.value}: {expiry.reason}")
    expire(session, locked, ReplicaMove.EXPIRY_BEGUN, moved)
    stripes.expire(session, stripes.Move.EXPIRY_BEGUN, moved)
    record(
        session,
        EventKind.EXPIRING,
        checkpoint_id=checkpoint_id,
        job_id=job_id,
        tier=tier,
        actor=ACTOR,
        detail={"rule": expiry.rule.value, "reason": expiry.reason, "bytes": expiry.bytes},
    )
    return BeginResult(state=BeginState.EXPIRING, rule=expiry.rule.value, reason=expiry.reason)


def tier_copy_state(session: Session, checkpoint_id: int, tier: str) -> str | None:
    return session.scalar(
        select(TierCopy.state).where(TierCopy.checkpoint_id == checkpoint_id, TierCopy.tier == tier)
    )


def _delete_lock(checkpoint_id: int, tier: str) -> ColumnElement[int]:
    # Deletes of one copy share this key; a collision with another copy's only makes one wait.
    return func.hashtextextended(f"tierpoint.delete/{checkpoint_id}/{tier}", 0)


def hold_for_delete(session: Session, checkpoint_id: int, tier: str) -> str | None:
    """The tier copy's state, with the copy's delete lock held in shared mode until the
    caller's transaction ends. A delete holds it while it removes the bytes; `finish_expiry`
    takes it exclusively before the tier copy becomes `expired`, and the step can be registered
    again only once every tier copy is expired. So every byte a delete removes is removed before
    a new checkpoint of the step is registered, and so before tierpoint writes anything of it;
    an attempt that starts later (a retry of an activity that outlived its timeout) finds the
    tier copy `expired` and deletes nothing. An advisory lock, not a row lock: pins, leases,
    promotions and expiries of other tiers lock the tier copies and must not wait for the I/O.
    The transaction stays open, idle, while the bytes go: a server-wide
    idle_in_transaction_session_timeout must not end it (and release the lock) half-way."""
    session.execute(text("SET LOCAL idle_in_transaction_session_timeout = 0"))
    # guard: delete-holds-the-copys-lock
    session.execute(select(func.pg_advisory_xact_lock_shared(_delete_lock(checkpoint_id, tier))))
    return tier_copy_state(session, checkpoint_id, tier)


def registered_copies(
    session: Session, checkpoint_id: int, tier: str, node: str | None
) -> list[RecordedCopy]:
    """The shards a copy of the checkpoint on `tier` consists of: what expiring it may delete,
    and nothing else, each with the identity of the file the catalog last read there. On a node's
    tier (`node` given): the shards the job registered on that node, any shard we keep a
    replica of there, and any a reader recorded keeping there (`cached_copies`: no identity, so
    deleted only when its bytes are the registered ones); an identity counts only from a replica
    on that node."""
    on_tier = and_(Replica.shard_id == Shard.id, Replica.tier == tier)
    identity = Replica.file_identity if node is None else _on_node(node)
    stmt = (
        select(Shard.path, Shard.size, Shard.checksum, identity)
        .outerjoin(Replica, on_tier)
        .where(Shard.checkpoint_id == checkpoint_id)
    )
    if node is not None:
        cached = cached_copies.shards_on(checkpoint_id, tier, node)
        stmt = stmt.where(
            (Shard.node_id == node) | (Replica.node_id == node) | Shard.id.in_(cached)
        )
    return [RecordedCopy(*row) for row in session.execute(stmt.order_by(Shard.ordinal))]


def record_kept(
    session: Session, checkpoint_id: int, tier: str, node: str | None, kept: Sequence[str]
) -> None:
    """A delete found files at some of the copy's paths that are not the ones the catalog
    verified there, and kept them: the checkpoint's history says so (and so does the step's
    next checkpoint's, which takes this history over)."""
    record(
        session,
        EventKind.KEPT,
        checkpoint_id=checkpoint_id,
        job_id=job_id_of_checkpoint(session, checkpoint_id),
        tier=tier,
        actor=ACTOR,
        detail={
            "reason": "replaced since verified",
            "node": node,
            "shards": len(kept),
            "examples": list(kept[:KEPT_EXAMPLES]),
        },
    )


def _on_node(node: str) -> ColumnElement[str | None]:
    return case((Replica.node_id == node, Replica.file_identity), else_=null())


def _begun_rule(session: Session, checkpoint_id: int, tier: str) -> str:
    """The rule recorded when the expiry began (its `expiring` event)."""
    detail = session.scalar(
        select(Event.detail)
        .where(
            Event.checkpoint_id == checkpoint_id,
            Event.tier == tier,
            Event.kind == EventKind.EXPIRING.value,
        )
        .order_by(Event.id.desc())
        .limit(1)
    )
    rule = detail.get("rule") if detail else None
    return rule if isinstance(rule, str) else UNFINISHED_RULE


def finish_expiry(session: Session, checkpoint_id: int, tier: str) -> str:
    """After the bytes are deleted: replicas then tier copy -> `expired`, event `expired` with the
    rule. Returns the tier copy's state afterwards (`expired`, or what it was if it was not
    `expiring`: nothing is changed then). Waits for deletes of the copy still running (an
    attempt that outlived its timeout), at most FINISH_LOCK_WAIT: the activity is retried."""
    session.execute(text(f"SET LOCAL lock_timeout = '{FINISH_LOCK_WAIT_MS}ms'"))
    # guard: finish-waits-for-deletes
    session.execute(select(func.pg_advisory_xact_lock(_delete_lock(checkpoint_id, tier))))
    locked = _lock(session, [checkpoint_id])
    if checkpoint_id not in locked.checkpoints:
        return "gone"
    state = _states(locked, checkpoint_id).get(tier)
    if state != TierState.EXPIRING.value:
        return state or "missing"
    copy = [(checkpoint_id, tier)]
    expire(session, locked, ReplicaMove.EXPIRED, copy)
    stripes.expire(session, stripes.Move.EXPIRED, copy)
    cached_copies.forget(session, checkpoint_id, tier)
    rule = _begun_rule(session, checkpoint_id, tier)
    move(session, locked, Move.EXPIRED, copy)
    job_id = job_id_of_checkpoint(session, checkpoint_id)
    record(
        session,
        EventKind.EXPIRED,
        checkpoint_id=checkpoint_id,
        job_id=job_id,
        tier=tier,
        actor=ACTOR,
        detail={"rule": rule},
    )
    return TierState.EXPIRED.value
