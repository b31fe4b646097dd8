"""A batch's reporter (activities/progress.py) on the real catalog: replica writes wait for a
flush, and what a heartbeat carries is what the next attempt resumes from."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from temporalio.testing import ActivityEnvironment

from activities.progress import BatchReporter, resume_details, resume_state_for
from activities.tier_reads import TierReads
from tests.helpers.lifecycle import new_job, random_shards, seed_checkpoint
from tierpoint.catalog.models import Replica, Shard
from tierpoint.catalog.replica.machine import ReplicaWrite
from tierpoint.config import Settings
from tierpoint.states import ReplicaState
from tierpoint.storage.base import ResumeState


def test_writes_wait_for_the_flush_and_heartbeats_carry_the_resume_point(
    settings: Settings, sessions: sessionmaker[Session]
) -> None:
    seeded = seed_checkpoint(settings, sessions, new_job(), 1, random_shards(["node-a"], 1, 16))
    cp = seeded.checkpoint_id
    with sessions() as s:
        shard_id = s.scalars(select(Shard.id).where(Shard.checkpoint_id == cp)).one()

    def lustre() -> tuple[str, int] | None:
        with sessions() as s:
            row = s.execute(
                select(Replica.state, Replica.bytes_done).where(
                    Replica.shard_id == shard_id, Replica.tier == "lustre"
                )
            ).one_or_none()
        return None if row is None else (row[0], row[1])

    # An interval no test reaches: only an explicit flush writes.
    reporter = BatchReporter(sessions, cp, "lustre", interval=3600.0, reads=TierReads())
    beats: list[tuple[Any, ...]] = []
    env = ActivityEnvironment()
    env.on_heartbeat = lambda *details: beats.append(details)
    resume = ResumeState(offset=8, crc=1234, upload_id="upload-1", extra={"parts": [1]})

    def copying() -> None:
        reporter.replica(ReplicaWrite(shard_id, ReplicaState.COPYING, "lustre:/x", None))
        reporter.flush_if_due()
        assert lustre() is None
        reporter.flush()
        assert lustre() == ("copying", 0)
        reporter.progress(shard_id, 0, resume)
        assert lustre() == ("copying", 0)
        reporter.flush()

    env.run(copying)
    assert lustre() == ("copying", 8)
    details = resume_details(beats[-1])
    assert resume_state_for(details, 0) == resume
    # A heartbeat from another shard, or from before the first byte, resumes nothing.
    assert resume_state_for(details, 1) is None
    assert resume_state_for(resume_details(({"ordinal": 0, "offset": 0},)), 0) is None
    assert resume_details(()) == {}
