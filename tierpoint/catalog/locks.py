"""The order in which the catalog's writers lock rows, and the one function that takes them.

Two transactions that each hold a row the other one waits for deadlock (Postgres aborts one of
them). The writers of the catalog's state machines lock through `lock_in_order`, which takes rows
in one order: nodes, then checkpoints, then tier copies, then replicas, and within a kind in key
order (node id; checkpoint id; checkpoint id and tier; replica id). A writer locks only the kinds
it needs, all in one call, so no two of them ever wait for each other in a cycle.

Some locks' modes are part of the invariants (docs/architecture.md, "Invariants"):

- a checkpoint's FOR UPDATE (retention's begin and finish) waits for and holds off a lease,
  which takes FOR KEY SHARE on the row before it reads which tiers are restorable (as a restore
  choosing a checkpoint does; the lease insert's foreign key check takes the same lock again): a
  pin or lease either commits before retention re-checks an expiry (which then keeps the copy) or
  after its flip to `expiring`, which the lease then sees. KEY SHARE conflicts with nothing but
  FOR UPDATE, so leases on one checkpoint (a whole job restarting) never wait for each other nor
  for an operator's action (`LEASE_LOCK`);
- its FOR NO KEY UPDATE (`ACTION_LOCK`: pins, quarantines and their lifts, retries, failures
  acknowledged, deletion; a rebuild's plan recording its hold, a reader recording the files it
  keeps) waits for and holds off the FOR UPDATE above and each other, but never a foreign-key
  check: the store's writers lock a tier copy and then record an event, whose foreign key takes
  KEY SHARE on the checkpoint row, so an action that held the row FOR UPDATE while it waited for
  that tier copy closed a cycle (Postgres ended one side as deadlocked, and the API answered 503
  `catalog_unavailable`);
- a node's FOR SHARE (a seal or copy writing replicas, a plan reading which nodes are lost) is
  ordered with its FOR UPDATE by an operator declaring it lost: the writer sees the declaration,
  or the declaration sees what the writer wrote.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from functools import cache
from typing import Any, Literal

from sqlalchemy import (
    BigInteger,
    BindParameter,
    ColumnElement,
    Integer,
    String,
    bindparam,
    exists,
    or_,
    select,
    tuple_,
)
from sqlalchemy.orm import Session, aliased

from tierpoint.catalog.models import Checkpoint, Job, Node, Replica, TierCopy


class RowLock(StrEnum):
    UPDATE = "FOR UPDATE"
    NO_KEY_UPDATE = "FOR NO KEY UPDATE"
    SHARE = "FOR SHARE"
    KEY_SHARE = "FOR KEY SHARE"


# How an operator's, an admin's or a job's action on a checkpoint locks its row (the docstring).
# guard: actions-lock-checkpoint-no-key-update
ACTION_LOCK = RowLock.NO_KEY_UPDATE
# How a lease, and a restore choosing a checkpoint, lock its row (the docstring).
LEASE_LOCK = RowLock.KEY_SHARE


@dataclass(frozen=True)
class CheckpointsOf:
    """A job's checkpoints (only the one at `step`, when given, on `branch` when given: see
    `at_step`), by the job's id."""

    job_id: int
    step: int | None = None
    branch: int | None = None


@dataclass(frozen=True)
class CheckpointAt:
    """The checkpoint at `step` of the job named `job`: the one saved on `branch` when given,
    else the one on the job's timeline (not superseded), else the newest superseded one."""

    job: str
    step: int
    branch: int | None = None


# Every tier copy of the checkpoints the same call locks.
EVERY_TIER_COPY: Literal["every"] = "every"


@dataclass(frozen=True)
class LockedCheckpoint:
    id: int
    job_id: int
    step: int
    pinned: bool
    deleted_at: datetime | None


@dataclass(frozen=True)
class LockedTierCopy:
    checkpoint_id: int
    tier: str
    state: str
    reason: str | None
    job_id: int
    restorable_at: datetime | None
    # a rebuild (re-replication, repair) holds copies on other tiers for this one
    rebuilding: bool
    quarantine_reason: str | None
    quarantine_evidence: bool


@dataclass(frozen=True)
class LockedReplica:
    id: int
    checkpoint_id: int
    tier: str
    shard_id: int


@dataclass
class Locked:
    """What one `lock_in_order` call locked (rows that do not exist are absent): held until the
    transaction ends. The state machines move only rows their caller holds here."""

    nodes: dict[str, datetime | None] = field(default_factory=dict)  # node -> lost_at
    node_lock: RowLock | None = None
    checkpoints: dict[int, LockedCheckpoint] = field(default_factory=dict)
    tier_copies: dict[tuple[int, str], LockedTierCopy] = field(default_factory=dict)
    replicas: dict[int, LockedReplica] = field(default_factory=dict)

    @property
    def lost_nodes(self) -> list[str]:
        """The locked nodes declared lost, sorted."""
        return sorted(n for n, lost_at in self.nodes.items() if lost_at is not None)


def _with(q: Any, mode: RowLock | None, of: Any = None) -> Any:
    if mode is None:
        return q
    if mode is RowLock.UPDATE:
        return q.with_for_update(of=of)
    if mode is RowLock.NO_KEY_UPDATE:
        return q.with_for_update(key_share=True, of=of)
    if mode is RowLock.KEY_SHARE:
        return q.with_for_update(read=True, key_share=True, of=of)
    return q.with_for_update(read=True, of=of)


def lock_in_order(
    session: Session,
    *,
    nodes: Iterable[str] = (),
    node_lock: RowLock | None = RowLock.SHARE,
    checkpoints: Collection[int] | CheckpointsOf | CheckpointAt = (),
    checkpoint_lock: RowLock | None = RowLock.UPDATE,
    tier_copies: Collection[tuple[int, str]] | Literal["every"] = (),
    tiers: Collection[str] | None = None,
    replicas: Collection[int] = (),
    replicas_in: str | None = None,
    into: Locked | None = None,
) -> Locked:
    """Lock, in the catalog's order and until the transaction ends: the `nodes` (in `node_lock`
    mode), the `checkpoints` (by id, a job's, or one by job name and step, in `checkpoint_lock`
    mode; for either, None reads the rows without a lock), the `tier_copies` (by (checkpoint id,
    tier), or every tier copy of the checkpoints locked here, on `tiers` only when given) and the
    `replicas` (by id; only those in state `replicas_in`, when given). Returns what it locked;
    with `into`, adds it there: a writer that must read before it knows what to lock next
    continues its lock set, which refuses a kind that is not after every kind it holds."""
    out = Locked() if into is None else into
    _check_order(
        out,
        bool(nodes),
        bool(checkpoints) or isinstance(checkpoints, CheckpointsOf | CheckpointAt),
        bool(tier_copies),
        bool(replicas),
    )
    if wanted := sorted(set(nodes)):
        by_id = select(Node.id, Node.lost_at).where(Node.id.in_(wanted)).order_by(Node.id)
        out.nodes = {r.id: r.lost_at for r in session.execute(_with(by_id, node_lock, of=Node))}
        out.node_lock = node_lock
    if checkpoints:
        out.checkpoints = _lock_checkpoints(session, checkpoints, checkpoint_lock)
    if tier_copies == EVERY_TIER_COPY:
        of_them: ColumnElement[bool] = TierCopy.checkpoint_id.in_(sorted(out.checkpoints))
        if tiers is not None:
            of_them = of_them & TierCopy.tier.in_(sorted(set(tiers)))
        out.tier_copies = _lock_tier_copies(session, of_them)
    elif pairs := sorted(set(tier_copies)):
        out.tier_copies = _lock_tier_copies(
            session, tuple_(TierCopy.checkpoint_id, TierCopy.tier).in_(pairs)
        )
    if ids := sorted(set(replicas)):
        of = select(Replica.id, Replica.checkpoint_id, Replica.tier, Replica.shard_id).where(
            Replica.id.in_(ids)
        )
        if replicas_in is not None:
            of = of.where(Replica.state == replicas_in)
        rows = session.execute(of.order_by(Replica.id).with_for_update())
        out.replicas = {r.id: LockedReplica(*r) for r in rows}
    return out


def _check_order(held: Locked, *asked: bool) -> None:
    kinds = (
        held.node_lock is not None,
        bool(held.checkpoints),
        bool(held.tier_copies),
        bool(held.replicas),
    )
    last_held = max((i for i, h in enumerate(kinds) if h), default=-1)
    first_asked = min((i for i, a in enumerate(asked) if a), default=len(asked))
    if first_asked <= last_held:
        raise AssertionError(
            "rows locked out of the catalog's order (docs: tierpoint/catalog/locks.py)"
        )


def _lock_checkpoints(
    session: Session, which: Collection[int] | CheckpointsOf | CheckpointAt, mode: RowLock | None
) -> dict[int, LockedCheckpoint]:
    if isinstance(which, CheckpointAt):
        params: dict[str, Any] = {"at_job": which.job, "at_step": which.step}
        if which.branch is not None:
            params["at_branch"] = which.branch
        rows = session.execute(_checkpoint_at(mode, which.branch is not None), params)
        return {r.id: LockedCheckpoint(*r) for r in rows}
    q = _CHECKPOINT_COLUMNS
    if isinstance(which, CheckpointsOf):
        q = q.where(Checkpoint.job_id == which.job_id)
        if which.step is not None:
            q = q.where(at_step(which.step, which.branch))
    elif ids := sorted(set(which)):
        q = q.where(Checkpoint.id.in_(ids))
    else:
        return {}
    rows = session.execute(_with(q.order_by(Checkpoint.id), mode, of=Checkpoint))
    return {r.id: LockedCheckpoint(*r) for r in rows}


_CHECKPOINT_COLUMNS = select(
    Checkpoint.id, Checkpoint.job_id, Checkpoint.step, Checkpoint.pinned, Checkpoint.deleted_at
)


@cache
def _checkpoint_at(mode: RowLock | None, on_branch: bool) -> Any:
    """The statement that finds (and locks) the checkpoint at a step by job name, built once per
    lock mode: the lookup every lease and restore of a storm makes, where building the statement
    and its cache key cost more of the API's CPU than sending it."""
    step = bindparam("at_step", type_=BigInteger)
    branch = bindparam("at_branch", type_=Integer) if on_branch else None
    q = (
        _CHECKPOINT_COLUMNS.join(Job, Job.id == Checkpoint.job_id)
        .where(Job.name == bindparam("at_job", type_=String), at_step(step, branch))
        .order_by(Checkpoint.id)
    )
    return _with(q, mode, of=Checkpoint)


# Built once: an alias builds a proxy of every column of the table, which cost more of the API's
# CPU than the rest of a lease's request when it was built per call.
_OTHER = aliased(Checkpoint, name="other_checkpoint")


def at_step(
    step: int | BindParameter[int], branch: int | BindParameter[int] | None
) -> ColumnElement[bool]:
    """The checkpoint a caller means by a step (of a job the query names): the one saved on
    `branch`, else the one on the timeline, else the newest superseded one (a correlated
    subquery: one probe of the (job_id, branch, step) index)."""
    if branch is not None:
        return (Checkpoint.step == step) & (Checkpoint.branch == branch)
    other = _OTHER
    better = exists().where(
        other.job_id == Checkpoint.job_id,
        other.step == step,
        or_(
            other.superseded_by.is_(None) & Checkpoint.superseded_by.is_not(None),
            Checkpoint.superseded_by.is_not(None) & (other.branch > Checkpoint.branch),
        ),
    )
    return (Checkpoint.step == step) & ~better


def _lock_tier_copies(session: Session, where: Any) -> dict[tuple[int, str], LockedTierCopy]:
    tc = TierCopy
    rows = session.execute(
        select(
            tc.checkpoint_id,
            tc.tier,
            tc.state,
            tc.reason,
            tc.job_id,
            tc.restorable_at,
            tc.rebuild_from.is_not(None),
            tc.quarantine_reason,
            tc.quarantine_evidence,
        )
        .where(where)
        .order_by(tc.checkpoint_id, tc.tier)
        .with_for_update(of=tc)
    )
    return {(r[0], r[1]): LockedTierCopy(*r) for r in rows}


def lock_checkpoint(session: Session, checkpoint_id: int, mode: RowLock = RowLock.UPDATE) -> bool:
    """Lock one checkpoint's row in `mode` until commit (through `lock_in_order`); False if the
    checkpoint is gone."""
    return bool(
        lock_in_order(session, checkpoints=[checkpoint_id], checkpoint_lock=mode).checkpoints
    )
