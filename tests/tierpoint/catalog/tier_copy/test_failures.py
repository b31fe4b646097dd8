"""Failed tier copies as operators see them, on a real catalog: the list newest first with the
total, the last replica error when the reason does not say it, whether a retry could help, one
page at a time; an acknowledgement takes a failure off the list (with an event) until the tier
copy changes again."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import func, insert, select, text, update
from sqlalchemy.orm import Session

from tests.helpers.catalog_rows import one_shard_checkpoint
from tierpoint.catalog.events import EventKind
from tierpoint.catalog.models import Checkpoint, Event, Job, TierCopy
from tierpoint.catalog.replica.machine import ReplicaWrite, upsert_replicas
from tierpoint.catalog.tier_copy.failures import (
    FailureFilter,
    acknowledge,
    acknowledge_matching,
    failures,
)
from tierpoint.errors import NothingToAcknowledge
from tierpoint.states import ReplicaState

TIERS, LOCAL = ["ssd", "lustre", "s3"], {"ssd"}


def _failed_job(session: Session) -> tuple[str, int]:
    """A job whose one checkpoint failed on ssd (a corrupt replica) and, after it, on lustre."""
    node = f"node-{uuid.uuid4().hex[:8]}"
    cp, shard = one_shard_checkpoint(session, node)
    bad = ReplicaWrite(shard, ReplicaState.CORRUPT, "/ssd/a", node, 0, "crc32c 1 != registered 2")
    upsert_replicas(session, cp, "ssd", [bad])
    job_id, job = session.execute(
        select(Job.id, Job.name)
        .join(Checkpoint, Checkpoint.job_id == Job.id)
        .where(Checkpoint.id == cp)
    ).one()
    session.execute(
        update(TierCopy)
        .where(TierCopy.checkpoint_id == cp)
        .values(state="failed", reason="1 of 1 shards have no verified replica on ssd")
    )
    session.execute(
        insert(TierCopy).values(
            checkpoint_id=cp,
            tier="lustre",
            job_id=job_id,
            step=1,
            state="failed",
            reason="Source tier ssd failed",
            updated_at=func.now() + text("interval '1 second'"),
        )
    )
    return job, cp


def test_the_failures_of_a_job_newest_first_one_page_at_a_time(session: Session) -> None:
    job, cp = _failed_job(session)
    mine = FailureFilter(job=job)
    first = failures(session, TIERS, LOCAL, mine, limit=1)
    assert first.total == 2 and first.next_key is not None
    (lustre,) = first.items
    assert (lustre.tier, lustre.reason) == ("lustre", "Source tier ssd failed")
    assert lustre.last_error is None
    (ssd,) = failures(session, TIERS, LOCAL, mine, limit=1, after=first.next_key).items
    assert (ssd.checkpoint_id, ssd.tier, ssd.last_error) == (cp, "ssd", "crc32c 1 != registered 2")
    # The first failed tier is the job's node's own, whose node is not lost: a retry can help.
    assert ssd.retryable and lustre.retryable
    assert failures(session, TIERS, LOCAL, FailureFilter(job=job, tier="s3")).total == 0
    assert failures(session, TIERS, LOCAL, FailureFilter(job=job, reason="source")).total == 1

    # With the ssd copy gone, a retry has nothing to start from: the view says so.
    session.execute(
        update(TierCopy)
        .where(TierCopy.checkpoint_id == cp, TierCopy.tier == "ssd")
        .values(state="expired")
    )
    (gone,) = failures(session, TIERS, LOCAL, mine).items
    assert gone.retry_refused is not None and gone.retry_refused.code == "no_verified_source"


def test_an_acknowledged_failure_leaves_the_list_until_its_copy_changes(session: Session) -> None:
    job, cp = _failed_job(session)
    mine = FailureFilter(job=job)
    assert acknowledge(session, job, 1, "ssd", "alice") == {
        "ssd": "1 of 1 shards have no verified replica on ssd"
    }
    assert [f.tier for f in failures(session, TIERS, LOCAL, mine).items] == ["lustre"]
    with pytest.raises(NothingToAcknowledge):
        acknowledge(session, job, 1, "ssd", "alice")
    done = acknowledge_matching(session, FailureFilter(job=job, reason="SOURCE TIER"), "bob")
    assert [(a.job, a.step, a.tier) for a in done] == [(job, 1, "lustre")]
    assert failures(session, TIERS, LOCAL, mine).total == 0
    with pytest.raises(NothingToAcknowledge):
        acknowledge_matching(session, mine, "bob")
    events = session.execute(
        select(Event.tier, Event.actor, Event.detail)
        .where(Event.checkpoint_id == cp, Event.kind == EventKind.ACKNOWLEDGED.value)
        .order_by(Event.id)
    ).all()
    assert [(e.tier, e.actor) for e in events] == [("ssd", "alice"), ("lustre", "bob")]
    assert events[1].detail["acknowledged_by"] == {"job": job, "reason": "SOURCE TIER"}

    # A later change of the copy (a retry that failed again) brings it back.
    session.execute(
        update(TierCopy)
        .where(TierCopy.checkpoint_id == cp, TierCopy.tier == "ssd")
        .values(updated_at=func.now() + text("interval '1 minute'"))
    )
    assert [f.tier for f in failures(session, TIERS, LOCAL, mine).items] == ["ssd"]
