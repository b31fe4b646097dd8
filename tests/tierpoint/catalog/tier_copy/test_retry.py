"""An operator's retry in the catalog: the rule of whether a retry can help (refused while a
repair copies the tier back, when the copies a run would start from are gone, or when the first
failed tier is a node's own on a lost node), the facts it reads from a real catalog, and the
failed tier copies locked and reset to pending with each retry counted."""

from __future__ import annotations

import uuid

from sqlalchemy import func, select, text, update
from sqlalchemy.orm import Session

from tests.helpers.catalog_rows import checkpoint_row, declare_lost, job_row, one_shard_checkpoint
from tierpoint.catalog.events import EventKind
from tierpoint.catalog.models import Event, Job, TierCopy
from tierpoint.catalog.tier_copy.retry import (
    RetryFacts,
    lock_failed,
    refusal,
    reset_failed,
    retry_facts,
)
from tierpoint.errors import CopyOnLostNode, NoVerifiedSource, RepairInProgress

TIERS = ["ssd", "lustre", "s3"]
LOCAL = {"ssd"}


def _facts(**states: str) -> RetryFacts:
    return RetryFacts({t: (s, "why" if s == "failed" else None) for t, s in states.items()})


def test_a_retry_is_refused_only_where_it_cannot_help() -> None:
    assert refusal("j", 1, TIERS, LOCAL, _facts(ssd="restorable", lustre="restorable")) is None
    assert refusal("j", 1, TIERS, LOCAL, _facts(ssd="restorable", lustre="failed")) is None
    # Failed tiers no longer configured: nothing for a run to copy.
    assert refusal("j", 1, ["ssd"], LOCAL, _facts(ssd="restorable", old="failed")) is None

    failed_lustre = _facts(ssd="restorable", lustre="failed").tier_copies
    rebuilding = RetryFacts(failed_lustre, {"lustre": ["s3"]})
    repair = refusal("j", 1, TIERS, LOCAL, rebuilding)
    assert isinstance(repair, RepairInProgress)
    assert repair.extra is not None and repair.extra["rebuilding"] == {"lustre": ["s3"]}

    gone = refusal("j", 1, TIERS, LOCAL, _facts(ssd="expired", lustre="failed"))
    assert isinstance(gone, NoVerifiedSource)
    assert gone.extra is not None and gone.extra["gone"] == {"ssd": "expired"}

    lost = RetryFacts(_facts(ssd="failed", lustre="failed").tier_copies, {}, ["node-a"])
    on_lost = refusal("j", 1, TIERS, LOCAL, lost)
    assert isinstance(on_lost, CopyOnLostNode)
    assert on_lost.extra is not None and on_lost.extra["tier"] == "ssd"
    # A lost node does not stand in the way of a shared tier's retry.
    lost_shared = RetryFacts(failed_lustre, {}, ["node-a"])
    assert refusal("j", 1, TIERS, LOCAL, lost_shared) is None


def test_the_facts_name_tier_copies_rebuilds_in_progress_and_lost_holders(
    session: Session,
) -> None:
    node = f"node-{uuid.uuid4().hex[:8]}"
    cid, _ = one_shard_checkpoint(session, node)
    declare_lost(session, node)
    session.execute(
        update(TierCopy)
        .where(TierCopy.checkpoint_id == cid)
        .values(
            state="failed",
            reason="node lost",
            rebuild_from=["s3"],
            rebuild_until=func.now() + text("interval '1 hour'"),
        )
    )
    job = job_row(session)
    past = checkpoint_row(session, job.id, 1)
    session.execute(
        update(TierCopy)
        .where(TierCopy.checkpoint_id == past)
        .values(rebuild_from=["s3"], rebuild_until=func.now() - text("interval '1 second'"))
    )
    facts = retry_facts(session, [cid, past])
    assert facts[cid] == RetryFacts({"ssd": ("failed", "node lost")}, {"ssd": ["s3"]}, [node])
    # A rebuild whose hold has ended is no longer in progress.
    assert facts[past] == RetryFacts({"ssd": ("pending", None)}, {}, [])
    assert retry_facts(session, []) == {}


def test_a_retry_resets_the_failed_copies_and_counts_its_attempts(session: Session) -> None:
    job = job_row(session)
    cid = checkpoint_row(session, job.id, 4, tiers=("ssd", "lustre"))
    session.execute(
        update(TierCopy)
        .where(TierCopy.checkpoint_id == cid, TierCopy.tier == "lustre")
        .values(state="failed", reason="disk full")
    )
    first = lock_failed(session, job.name, 4)
    assert (first.checkpoint_id, first.attempt, first.failed) == (cid, 1, {"lustre": "disk full"})
    reset_failed(session, first, "operator", "retry-1")
    copies = session.execute(
        select(TierCopy.tier, TierCopy.state, TierCopy.reason).where(TierCopy.checkpoint_id == cid)
    ).all()
    assert sorted(tuple(c) for c in copies) == [
        ("lustre", "pending", None),
        ("ssd", "pending", None),
    ]
    (event,) = session.scalars(
        select(Event.detail).where(
            Event.checkpoint_id == cid, Event.kind == EventKind.OPERATOR_ACTION.value
        )
    )
    assert event["attempt"] == 1 and event["tiers"] == ["lustre"]
    assert event["reasons"] == {"lustre": "disk full"}
    second = lock_failed(session, job.name, 4)
    assert (second.attempt, second.failed) == (2, {})
    assert session.scalar(select(Job.name).where(Job.id == second.job_id)) == job.name
