"""Registration in the catalog, on a real catalog (invariant 5): a registration writes the job,
the checkpoint, its shards in manifest order and a pending tier copy per tier in one go; the
same manifest again returns the first checkpoint, a different one at the step is refused, and
shards on a node that is unknown or lost are refused before anything is written; the lifecycle's
start is recorded once, and the reconciler finds the unstarted."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from sqlalchemy import func, select, text, update
from sqlalchemy.orm import Session

from tests.helpers.catalog_rows import declare_lost
from tierpoint.catalog.checkpoint.registration import (
    mark_workflow_started,
    register_checkpoint,
    unstarted_checkpoints,
)
from tierpoint.catalog.models import Checkpoint, Job, Shard, TierCopy
from tierpoint.catalog.node.registry import upsert_node
from tierpoint.errors import CheckpointConflict, UnknownNode
from tierpoint.manifest import Manifest, ShardSpec


def _node(session: Session) -> str:
    node = f"node-{uuid.uuid4().hex[:8]}"
    upsert_node(session, node, {})
    return node


def _manifest(step: int, node: str, *paths: str) -> Manifest:
    return Manifest(
        step=step, shards=[ShardSpec(path=p, size=10, crc32c="0badf00d", node=node) for p in paths]
    )


def test_a_registration_is_written_once_and_a_different_manifest_is_refused(
    session: Session,
) -> None:
    job, node = f"job-{uuid.uuid4().hex[:8]}", _node(session)
    first = register_checkpoint(session, job, _manifest(5, node, "b.bin", "a.bin"), ["ssd", "s3"])
    assert first.created and not first.workflow_started and first.branch == 1
    shards = session.execute(
        select(Shard.ordinal, Shard.path, Shard.node_id)
        .where(Shard.checkpoint_id == first.checkpoint_id)
        .order_by(Shard.ordinal)
    ).all()
    assert [tuple(s) for s in shards] == [(0, "b.bin", node), (1, "a.bin", node)]
    copies = session.execute(
        select(TierCopy.tier, TierCopy.state).where(TierCopy.checkpoint_id == first.checkpoint_id)
    ).all()
    assert sorted(tuple(c) for c in copies) == [("s3", "pending"), ("ssd", "pending")]

    # The same shards in another order are the same manifest: the first registration answers.
    again = register_checkpoint(session, job, _manifest(5, node, "a.bin", "b.bin"), ["ssd", "s3"])
    assert (again.checkpoint_id, again.created) == (first.checkpoint_id, False)
    with pytest.raises(CheckpointConflict):
        register_checkpoint(session, job, _manifest(5, node, "a.bin"), ["ssd", "s3"])
    assert session.scalar(select(func.count()).where(Checkpoint.job_id == first.job_id)) == 1


def test_shards_on_unknown_or_lost_nodes_are_refused_before_anything_is_written(
    session: Session,
) -> None:
    job, alive, lost = f"job-{uuid.uuid4().hex[:8]}", _node(session), _node(session)
    declare_lost(session, lost)
    manifest = Manifest(
        step=1,
        shards=[
            ShardSpec(path="a.bin", size=1, crc32c=None, node=alive),
            ShardSpec(path="b.bin", size=1, crc32c=None, node=lost),
            ShardSpec(path="c.bin", size=1, crc32c=None, node="never-seen"),
        ],
    )
    with pytest.raises(UnknownNode) as refused:
        register_checkpoint(session, job, manifest, ["ssd"])
    assert refused.value.extra == {"nodes": ["never-seen", lost]}
    assert sorted(e["code"] for e in refused.value.errors or []) == ["lost_node", "unknown_node"]
    assert session.scalar(select(Job.id).where(Job.name == job)) is None


def test_the_lifecycles_start_is_recorded_once_and_the_unstarted_are_found(
    session: Session,
) -> None:
    job, node = f"job-{uuid.uuid4().hex[:8]}", _node(session)
    done = register_checkpoint(session, job, _manifest(1, node, "a.bin"), ["ssd"])
    waiting = register_checkpoint(session, job, _manifest(2, node, "a.bin"), ["ssd"])
    session.execute(
        update(Checkpoint)
        .where(Checkpoint.job_id == done.job_id)
        .values(created_at=func.now() - text("interval '1 hour'"))
    )
    assert mark_workflow_started(session, done.checkpoint_id)
    assert not mark_workflow_started(session, done.checkpoint_id)
    found = [u for u in unstarted_checkpoints(session, timedelta(minutes=5), 1000) if u.job == job]
    assert [(u.checkpoint_id, u.step) for u in found] == [(waiting.checkpoint_id, 2)]
    # Younger than the grace asked for: not the reconciler's yet.
    assert not [u for u in unstarted_checkpoints(session, timedelta(hours=2), 1000) if u.job == job]
