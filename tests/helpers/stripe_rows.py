"""Rows of a coded peer tier on a real catalog, for the stripe catalog's tests: a checkpoint
with its k+m holders, its stripes placed and read back, its tier copy."""

from __future__ import annotations

import uuid

from sqlalchemy import insert, select
from sqlalchemy.orm import Session
from tierpoint_client.erasure import Code

from tierpoint.catalog.models import Checkpoint, Job, Shard, TierCopy
from tierpoint.catalog.node.registry import upsert_node
from tierpoint.catalog.stripe import machine as stripes

CODE = Code(4, 2)
TIER = "stripes"


def checkpoint(session: Session, shards: int) -> tuple[int, list[int], list[str]]:
    """A checkpoint of `shards` shards on node `src`, and the k+m holders of its stripes."""
    tag = uuid.uuid4().hex[:8]
    nodes = [f"src-{tag}", *(f"h{i}-{tag}" for i in range(CODE.width))]
    for node in nodes:
        upsert_node(session, node, {})
    job = session.scalar(insert(Job).values(name=f"job-{tag}").returning(Job.id))
    cp = session.scalar(
        insert(Checkpoint)
        .values(job_id=job, step=1, total_bytes=shards, shard_count=shards, manifest_digest="d")
        .returning(Checkpoint.id)
    )
    assert cp is not None
    ids = [
        session.scalar(
            insert(Shard)
            .values(checkpoint_id=cp, ordinal=i, path=f"f{i}", size=1, node_id=nodes[0])
            .returning(Shard.id)
        )
        for i in range(shards)
    ]
    return cp, [i for i in ids if i is not None], nodes[1:]


def placed_checkpoint(session: Session, shards: int) -> tuple[int, list[int], list[str]]:
    """`checkpoint`, with the k+m stripes of every shard placed on its holders."""
    cp, ids, holders = checkpoint(session, shards)
    for shard in ids:
        stripes.place(session, cp, TIER, str(CODE), placed(shard, holders))
    return cp, ids, holders


def names(session: Session, cp: int) -> tuple[str, str]:
    """The job `checkpoint` made for `cp`, and the node its shards are on."""
    job = session.scalar(
        select(Job.name).join(Checkpoint, Checkpoint.job_id == Job.id).where(Checkpoint.id == cp)
    )
    assert job is not None
    return job, f"src-{job.removeprefix('job-')}"


def placed(shard: int, holders: list[str]) -> list[stripes.PlacedStripe]:
    return [stripes.PlacedStripe(shard, i, h, 100 + i, f"{i:08x}") for i, h in enumerate(holders)]


def read_back_all(session: Session, shards: list[int]) -> dict[str, int]:
    results = [stripes.ReadBack(s, i, 100 + i, f"{i:08x}") for s in shards for i in range(6)]
    return stripes.read_back(session, TIER, results)


def tier_copy(session: Session, cp: int) -> None:
    job_id, step = session.execute(
        select(Checkpoint.job_id, Checkpoint.step).where(Checkpoint.id == cp)
    ).one()
    session.execute(insert(TierCopy).values(checkpoint_id=cp, tier=TIER, job_id=job_id, step=step))


def tier_copy_state(session: Session, cp: int) -> tuple[str, str | None]:
    state, reason = session.execute(
        select(TierCopy.state, TierCopy.reason).where(
            TierCopy.checkpoint_id == cp, TierCopy.tier == TIER
        )
    ).one()
    return state, reason
