"""Superseded: a checkpoint a rollback left behind. It stays listed and restorable by branch, is
never "latest", and retention expires it first. The one writer of `checkpoint.superseded_by` and
of its copy on `checkpoint_tier.superseded` (which "latest" reads through its index)."""

from __future__ import annotations

from sqlalchemy import String, func, insert, literal, select, update
from sqlalchemy.orm import Session

from tierpoint.catalog.events import EventKind
from tierpoint.catalog.locks import ACTION_LOCK, EVERY_TIER_COPY, lock_in_order
from tierpoint.catalog.models import Checkpoint, Event, TierCopy


def lock_for_rollback(session: Session, job_id: int, step: int, target_id: int) -> list[int]:
    """Lock, in the catalog's order, a rollback's target and every checkpoint of the job's
    timeline after `step` with their tier copies; returns the latter's ids. The caller holds the
    job's row FOR NO KEY UPDATE (no checkpoint joins the timeline meanwhile). A retention expiry
    of one of them (which locks its row first) is ordered with the rollback: the rollback sees
    a target's copy already `expiring`, or the expiry's re-check sees the new timeline."""
    after = list(
        session.scalars(
            select(Checkpoint.id).where(
                Checkpoint.job_id == job_id,
                Checkpoint.superseded_by.is_(None),
                Checkpoint.step > step,
            )
        )
    )
    # As every action locks a checkpoint (FOR NO KEY UPDATE): a promotion holding a tier copy
    # records its event under KEY SHARE on the row, which FOR UPDATE would wait on (a deadlock).
    lock_in_order(
        session,
        checkpoints=[target_id, *after],
        checkpoint_lock=ACTION_LOCK,
        tier_copies=EVERY_TIER_COPY,
    )
    return after


def supersede(
    session: Session, job_id: int, ids: list[int], step: int, by_branch: int, *, actor: str | None
) -> list[int]:
    """The checkpoints `ids` (locked by `lock_for_rollback`) become superseded by `by_branch`;
    returns their steps, oldest first. No copy is touched: a copy in flight goes on, a lease
    keeps holding.

    One statement however many there are (a rollback over a long run's tail must not cost a
    statement per checkpoint): the checkpoints' update, their tier copies' flag and their events
    are data-modifying parts of one WITH, which all see the same snapshot and the rows `done`
    returns."""
    if not ids:
        return []
    done = (
        update(Checkpoint)
        .where(Checkpoint.id.in_(ids), Checkpoint.superseded_by.is_(None))
        .values(superseded_by=by_branch)
        .returning(Checkpoint.id, Checkpoint.step)
        .cte("done")
    )
    flagged = (
        update(TierCopy)
        .where(TierCopy.checkpoint_id.in_(select(done.c.id)))
        .values(superseded=True)
        .cte("flagged")
    )
    detail = func.jsonb_build_object(
        "step", done.c.step, "by_branch", by_branch, "rollback_to", step
    )
    recorded = (
        insert(Event)
        .from_select(
            ["kind", "checkpoint_id", "job_id", "actor", "detail"],
            select(
                literal(EventKind.SUPERSEDED.value),
                done.c.id,
                literal(job_id),
                literal(actor, String),
                detail,
            ),
        )
        .cte("recorded")
    )
    steps = session.scalars(
        select(done.c.step).add_cte(flagged, recorded).order_by(done.c.step)
    ).all()
    return list(steps)
