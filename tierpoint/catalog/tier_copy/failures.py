"""Failed tier copies as operators see them: the failures list (with how many there are in all,
and whether a retry could help each one) and an operator's acknowledgement, of one checkpoint's
failures or of every failure of a job or with a reason. An acknowledged failure leaves the list
(and the jobs' failed counts) and stays in the checkpoint's history as an `acknowledged` event
with the actor.

A failure is a tier copy in state `failed`, nothing else: once a repair (or a retry) makes the copy
restorable again, it is no failure any more, acknowledged or not. The tier copy keeps its state when
acknowledged (`failed`: nothing was copied, retention still protects the other copies);
`acknowledged_at` records the `updated_at` it acknowledged, so any later change of the tier copy (a
retry, another failure) brings it back to the list without anyone clearing a flag.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Select,
    String,
    and_,
    column,
    func,
    select,
    tuple_,
    update,
    values,
)
from sqlalchemy.dialects.postgresql import distinct_on
from sqlalchemy.orm import Session

from tierpoint.catalog.engine import catalog_now
from tierpoint.catalog.events import EventKind, record
from tierpoint.catalog.job.lookup import find_checkpoint
from tierpoint.catalog.locks import ACTION_LOCK
from tierpoint.catalog.models import Checkpoint, Job, Replica, TierCopy
from tierpoint.catalog.tier_copy.retry import refusal, retry_facts
from tierpoint.errors import NothingToAcknowledge
from tierpoint.states import TierState


@dataclass(frozen=True)
class RetryRefusalView:
    """Why a retry cannot help: the problem a retry would be refused with."""

    code: str
    detail: str
    why: str  # the detail's own clause, without the failure's reason (which the view has)


@dataclass
class FailureView:
    job: str
    step: int
    checkpoint_id: int
    tier: str
    reason: str | None
    failed_at: datetime
    # the most recent replica error on that tier, unless the reason says it already
    last_error: str | None
    retry_refused: RetryRefusalView | None = None  # None: a retry can help

    @property
    def retryable(self) -> bool:
        return self.retry_refused is None


@dataclass
class FailurePageView:
    items: list[FailureView]
    next_key: tuple[str, int, str] | None  # keyset of the next page
    total: int  # open failures matching, on every page
    now: datetime


FailureKey = tuple[str, int, str]  # (failed_at ISO, checkpoint id, tier): the keyset of the list


def unacknowledged() -> ColumnElement[bool]:
    """A tier copy that is failed and that nobody acknowledged since it last changed: what the
    failures view lists and the jobs view counts as failed."""
    ct = TierCopy
    return (ct.state == TierState.FAILED.value) & ct.acknowledged_at.is_distinct_from(ct.updated_at)


@dataclass(frozen=True)
class FailureFilter:
    """Which open failures: of one job, with a reason containing some text (any case), on one
    tier, that failed at or before a time (what an operator saw when deciding)."""

    job: str | None = None
    reason: str | None = None
    tier: str | None = None
    until: datetime | None = None

    def where(self) -> list[ColumnElement[bool]]:
        ct = TierCopy
        out = [unacknowledged()]
        if self.job is not None:
            out.append(Job.name == self.job)
        if self.reason is not None:
            out.append(ct.reason.icontains(self.reason, autoescape=True))
        if self.tier is not None:
            out.append(ct.tier == self.tier)
        if self.until is not None:
            out.append(ct.updated_at <= self.until)
        return out

    def described(self) -> dict[str, str]:
        """The filter as an operator gave it, for the events' audit trail."""
        given = {"job": self.job, "reason": self.reason, "tier": self.tier}
        return {k: v for k, v in given.items() if v is not None}


def _open(matching: FailureFilter) -> Select[int, str, str | None, datetime, str, int]:
    ct = TierCopy
    return (
        select(ct.checkpoint_id, ct.tier, ct.reason, ct.updated_at, Job.name, Checkpoint.step)
        .join(Checkpoint, Checkpoint.id == ct.checkpoint_id)
        .join(Job, Job.id == ct.job_id)
        .where(*matching.where())
    )


def failures(
    session: Session,
    tiers: Sequence[str],
    local: Collection[str],
    matching: FailureFilter,
    *,
    limit: int = 100,
    after: FailureKey | None = None,
) -> FailurePageView:
    """Open failures, newest first, with the tier copy's reason, the last replica error (when the
    reason does not say it already), whether a retry could help, and how many match in all.
    `tiers`: the configured tiers in order; `local`: the ones local to a node."""
    ct = TierCopy
    now = catalog_now(session)
    q = _open(matching).order_by(ct.updated_at.desc(), ct.checkpoint_id.desc(), ct.tier.desc())
    if after is not None:
        at, cid, tier = after
        q = q.where(
            tuple_(ct.updated_at, ct.checkpoint_id, ct.tier)
            < tuple_(datetime.fromisoformat(at), cid, tier)
        )
    rows = session.execute(q.limit(limit + 1)).all()
    more = len(rows) > limit
    rows = rows[:limit]
    # Failed tier copies are few (a partial index holds just them): counting them all is cheap.
    total = session.scalar(select(func.count()).select_from(_open(matching).subquery()))
    errors = last_errors(session, [(r.checkpoint_id, r.tier) for r in rows])
    facts = retry_facts(session, sorted({r.checkpoint_id for r in rows}))
    views = []
    for r in rows:
        refused = refusal(r.name, r.step, tiers, local, facts[r.checkpoint_id])
        error = errors.get((r.checkpoint_id, r.tier))
        views.append(
            FailureView(
                job=r.name,
                step=r.step,
                checkpoint_id=r.checkpoint_id,
                tier=r.tier,
                reason=r.reason,
                failed_at=r.updated_at,
                # A node declared lost, a reconciliation: the replica's error is the reason's
                # own words, shown once.
                last_error=None if error and error in (r.reason or "") else error,
                retry_refused=(
                    RetryRefusalView(refused.code, refused.detail, str(refused.extra["why"]))
                    if refused is not None
                    else None
                ),
            )
        )
    last = rows[-1] if more else None
    key = (last.updated_at.isoformat(), last.checkpoint_id, last.tier) if last else None
    return FailurePageView(views, key, int(total or 0), now)


@dataclass(frozen=True)
class Acknowledged:
    job: str
    step: int
    tier: str
    reason: str | None


def acknowledge(
    session: Session,
    job: str,
    step: int,
    tier: str | None,
    actor: str,
    branch: int | None = None,
) -> dict[str, str | None]:
    """Acknowledge the checkpoint's (at `step`, on `branch` when given) open failures (on
    `tier`, or on every tier); returns them (tier -> reason). Raises CheckpointNotFound,
    NothingToAcknowledge. The caller commits."""
    checkpoint_id, _, _ = find_checkpoint(session, job, step, lock=ACTION_LOCK, branch=branch)
    one = TierCopy.checkpoint_id == checkpoint_id
    done = _acknowledge(session, FailureFilter(job=job, tier=tier), actor, None, one)
    if not done:
        on = f" on {tier}" if tier is not None else ""
        raise NothingToAcknowledge(f"{job}/{step} has no unacknowledged failure{on}")
    return {a.tier: a.reason for a in done}


def acknowledge_matching(
    session: Session, matching: FailureFilter, actor: str
) -> list[Acknowledged]:
    """Acknowledge every open failure the filter matches (of a job, with a reason, ...), each
    recorded in its checkpoint's history with the actor and the filter. Raises
    NothingToAcknowledge when none does. The caller commits."""
    done = _acknowledge(session, matching, actor, matching.described())
    if not done:
        raise NothingToAcknowledge(f"no unacknowledged failure matches {matching.described()}")
    return done


def _acknowledge(
    session: Session,
    matching: FailureFilter,
    actor: str,
    by: dict[str, str] | None,
    *also: ColumnElement[bool],
) -> list[Acknowledged]:
    ct = TierCopy
    # The tier copies locked in the order promotion and damage lock them, so a copy repaired (or
    # failed again) meanwhile is seen as it is now: it no longer matches, or matches anew.
    rows = session.execute(
        _open(matching)
        .add_columns(ct.job_id)
        .where(*also)
        .order_by(ct.checkpoint_id, ct.tier)
        .with_for_update(of=ct)
    ).all()
    if not rows:
        return []
    keys = [(r.checkpoint_id, r.tier) for r in rows]
    session.execute(
        update(ct)
        .where(tuple_(ct.checkpoint_id, ct.tier).in_(keys))
        .values(acknowledged_at=ct.updated_at)
    )
    for r in rows:
        detail: dict[str, Any] = {"reason": r.reason}
        if by is not None:
            detail["acknowledged_by"] = by  # the filter that matched it, for the audit
        record(
            session,
            EventKind.ACKNOWLEDGED,
            checkpoint_id=r.checkpoint_id,
            job_id=r.job_id,
            tier=r.tier,
            actor=actor,
            detail=detail,
        )
    return [Acknowledged(r.name, r.step, r.tier, r.reason) for r in rows]


def last_errors(session: Session, pairs: Sequence[tuple[int, str]]) -> dict[tuple[int, str], str]:
    """(checkpoint id, tier) -> the latest error recorded on one of its replicas there."""
    errors: dict[tuple[int, str], str] = {}
    if not pairs:
        return errors
    # A join to VALUES, not (checkpoint_id, tier) IN (...): see tier_progress.
    wanted = values(
        column("checkpoint_id", BigInteger), column("tier", String), name="wanted"
    ).data(list(pairs))
    for e in session.execute(
        select(Replica.checkpoint_id, Replica.tier, Replica.error)
        .ext(distinct_on(Replica.checkpoint_id, Replica.tier))
        .select_from(wanted)
        .join(
            Replica,
            and_(
                Replica.checkpoint_id == wanted.c.checkpoint_id,
                Replica.tier == wanted.c.tier,
            ),
        )
        .where(Replica.error.is_not(None))
        .order_by(Replica.checkpoint_id, Replica.tier, Replica.updated_at.desc())
    ):
        errors[(e.checkpoint_id, e.tier)] = e.error
    return errors
