"""What a batch activity costs the catalog, counted on the real connections it uses: a seal and a
copy each take two transactions (the batch's reads with its first writes, then its outcomes with
its events) however many shards the batch holds; a storm of tiny checkpoints is bound by these
round trips and commits, not by bytes. The outcomes are the same as one transaction per step
made: every replica verified, one event per batch."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Engine, event, select
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session, sessionmaker
from temporalio.testing import ActivityEnvironment

from activities.lifecycle import LifecycleActivities
from activities.stores import Stores
from tests.helpers.lifecycle import new_job, random_shards, seed_checkpoint
from tierpoint.catalog.models import Event, Replica
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
