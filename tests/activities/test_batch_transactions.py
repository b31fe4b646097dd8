"""What a batch activity costs the catalog, counted on the real connections it uses: a seal and a
copy each take two transactions (the batch's reads with its first writes, then its outcomes with
its events) however many shards the batch holds; a storm of tiny checkpoints is bound by these
round trips and commits, not by bytes. The outcomes are the same as one transaction per step
made: every replica verified, one event per batch."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import Engine, event, select
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session, sessionmaker
from temporalio.testing import ActivityEnvironment

from activities.lifecycle import LifecycleActivities
from activities.stores import Stores
from tests.helpers.lifecycle import new_job, random_shards, seed_checkpoint
from tierpoint.catalog.models import Checkpoint, Event, Replica, TierCopy
from tierpoint.config import Settings
from tierpoint.contract.lifecycle import CopyInput, PlanInput, PromoteInput, SealInput

SHARDS = 40


@contextmanager
def transactions(engine: Engine) -> Iterator[list[str]]:
    """How each transaction begun on `engine`'s connections ended, in order."""
    ended: list[str] = []

    def committed(_: Connection) -> None:
        ended.append("commit")

    def rolled_back(_: Connection) -> None:
        ended.append("rollback")

    event.listen(engine, "commit", committed)
    event.listen(engine, "rollback", rolled_back)
    try:
        yield ended
    finally:
        event.remove(engine, "commit", committed)
        event.remove(engine, "rollback", rolled_back)


def test_a_seal_and_a_copy_cost_two_transactions_each_whatever_the_batch_holds(
    settings: Settings, engine: Engine, sessions: sessionmaker[Session]
) -> None:
    # No flush in between: what is counted is the batch's own cost, not the progress reports
    # that a slow batch adds.
    settings = settings.model_copy(update={"progress_interval_seconds": 3600.0})
    seeded = seed_checkpoint(
        settings, sessions, new_job(), 1, random_shards(["node-a"], SHARDS, 1024)
    )
    cp, job, step = seeded.checkpoint_id, seeded.job, seeded.step
    acts = LifecycleActivities(sessions, settings, Stores(settings), node="node-a")
    env = ActivityEnvironment()
    (batch,) = env.run(acts.plan, PlanInput(checkpoint_id=cp)).batches
    assert batch.last - batch.first + 1 == SHARDS

    seal = SealInput(checkpoint_id=cp, job=job, step=step, batch=batch, tier="ssd")
    with transactions(engine) as sealing:
        sealed = env.run(acts.seal_batch, seal)
    assert sealed.verified == SHARDS
    assert sealing == ["commit", "commit"]

    env.run(acts.promote, PromoteInput(checkpoint_id=cp, tier="ssd", later_tiers=["lustre"]))
    copy = CopyInput(
        checkpoint_id=cp, job=job, step=step, batch=batch, source="ssd", destination="lustre"
    )
    with transactions(engine) as copying:
        copied = env.run(acts.copy_batch, copy)
    assert copied.verified == SHARDS
    assert copying == ["commit", "commit"]

    with sessions() as s:
        states = s.scalars(
            select(Replica.state).where(Replica.checkpoint_id == cp, Replica.tier == "lustre")
        ).all()
        kinds = s.scalars(
            select(Event.kind).where(
                Event.checkpoint_id == cp, Event.kind.in_(["sealed", "copied", "verified"])
            )
        ).all()
    assert sorted(states) == ["verified"] * SHARDS
    assert sorted(kinds) == ["copied", "sealed", "verified"]

    # A rerun finds everything verified and still costs two.
    with transactions(engine) as again:
        rerun = env.run(acts.copy_batch, copy)
    assert (rerun.verified, rerun.skipped) == (SHARDS, SHARDS)
    assert again == ["commit", "commit"]


@contextmanager
def statements(engine: Engine) -> Iterator[list[str]]:
    """Every statement sent on `engine`'s connections, in order (BEGIN and COMMIT are not
    statements here: psycopg sends them outside the cursor)."""
    sent: list[str] = []

    def executed(_c: Connection, _cur: object, sql: str, *_: object) -> None:
        sent.append(sql)

    event.listen(engine, "before_cursor_execute", executed)
    try:
        yield sent
    finally:
        event.remove(engine, "before_cursor_execute", executed)


def test_a_tiny_batch_reads_its_checkpoint_once(
    settings: Settings, engine: Engine, sessions: sessionmaker[Session]
) -> None:
    """A storm of tiny checkpoints pays per statement (each a round trip and its share of the
    worker's CPU), so a batch reads what it needs of its checkpoint (branch, job, the key layout
    of each tier copy) in one statement, and records its events in one."""
    settings = settings.model_copy(update={"progress_interval_seconds": 3600.0})
    seeded = seed_checkpoint(settings, sessions, new_job(), 1, random_shards(["node-a"], 2, 1024))
    cp, job, step = seeded.checkpoint_id, seeded.job, seeded.step
    acts = LifecycleActivities(sessions, settings, Stores(settings), node="node-a")
    env = ActivityEnvironment()
    (batch,) = env.run(acts.plan, PlanInput(checkpoint_id=cp)).batches

    seal = SealInput(checkpoint_id=cp, job=job, step=step, batch=batch, tier="ssd")
    with statements(engine) as sealing:
        assert env.run(acts.seal_batch, seal).verified == 2
    env.run(acts.promote, PromoteInput(checkpoint_id=cp, tier="ssd", later_tiers=["lustre"]))
    copy = CopyInput(
        checkpoint_id=cp, job=job, step=step, batch=batch, source="ssd", destination="lustre"
    )
    with statements(engine) as copying:
        assert env.run(acts.copy_batch, copy).verified == 2

    def reads_of_checkpoint(sent: list[str]) -> int:
        return sum(1 for sql in sent if " FROM checkpoint " in f"{' '.join(sql.split())} ")

    def event_inserts(sent: list[str]) -> int:
        return sum(1 for sql in sent if sql.lstrip().startswith("INSERT INTO event "))

    assert (reads_of_checkpoint(sealing), event_inserts(sealing)) == (1, 1)
    assert (reads_of_checkpoint(copying), event_inserts(copying)) == (1, 1)
    # Everything else a batch sends: the node check, its shards, its replicas written (and the
    # copy's read-back recorded), the tier's read rate.
    assert (len(sealing), len(copying)) == (7, 7)
    with sessions() as s:
        events = s.execute(
            select(Event.kind, Event.job_id, Event.tier)
            .where(Event.checkpoint_id == cp, Event.kind.in_(["sealed", "copied", "verified"]))
            .order_by(Event.id)
        ).all()
        job_id = s.scalar(select(Checkpoint.job_id).where(Checkpoint.id == cp))
    assert [(e.kind, e.tier) for e in events] == [
        ("sealed", "ssd"),
        ("copied", "lustre"),
        ("verified", "lustre"),
    ]
    assert {e.job_id for e in events} == {job_id}


def test_a_promotion_reads_its_checkpoint_once_and_observes_its_lag_from_that_read(
    settings: Settings, engine: Engine, sessions: sessionmaker[Session]
) -> None:
    """A storm checkpoint is promoted once per tier: its head (for the log) and its age (the
    promotion lag) come from one read, in the promoting transaction, so the lag observed is the
    tier copy's restorable_at - created_at to the microsecond."""
    seeded = seed_checkpoint(settings, sessions, new_job(), 1, random_shards(["node-a"], 2, 1024))
    cp, job, step = seeded.checkpoint_id, seeded.job, seeded.step
    acts = LifecycleActivities(sessions, settings, Stores(settings), node="node-a")
    env = ActivityEnvironment()
    (batch,) = env.run(acts.plan, PlanInput(checkpoint_id=cp)).batches
    env.run(
        acts.seal_batch, SealInput(checkpoint_id=cp, job=job, step=step, batch=batch, tier="ssd")
    )

    lag_sum = "tierpoint_worker_promotion_lag_seconds_sum"
    before = REGISTRY.get_sample_value(lag_sum, {"tier": "ssd"}) or 0.0
    with statements(engine) as promoting:
        promoted = env.run(
            acts.promote, PromoteInput(checkpoint_id=cp, tier="ssd", later_tiers=["lustre"])
        )
    assert promoted.state == "restorable"
    reads = [sql for sql in promoting if " FROM checkpoint " in f"{' '.join(sql.split())} "]
    assert len(reads) == 1, reads
    observed = (REGISTRY.get_sample_value(lag_sum, {"tier": "ssd"}) or 0.0) - before
    with sessions() as s:
        created = s.scalar(select(Checkpoint.created_at).where(Checkpoint.id == cp))
        restorable = s.scalar(
            select(TierCopy.restorable_at).where(
                TierCopy.checkpoint_id == cp, TierCopy.tier == "ssd"
            )
        )
    assert created is not None and restorable is not None
    assert observed == pytest.approx((restorable - created).total_seconds(), abs=1e-6)
