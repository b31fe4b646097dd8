"""The files readers keep on a node's local tier, on a real catalog: recorded once each, never a
node's own file nor one it holds a replica of, refused once the tier's copy is being expired, and
forgotten with that copy."""

from __future__ import annotations

import uuid

from sqlalchemy import func, insert, select, update
from sqlalchemy.orm import Session

from tierpoint.catalog.models import CachedCopy, Checkpoint, Job, Replica, Shard, TierCopy
from tierpoint.catalog.node.registry import upsert_node
from tierpoint.catalog.replica.cached_copies import (
    forget,
    nodes_on,
    record,
    shards_on,
    unknown_paths,
)
from tierpoint.states import TierState


def _checkpoint(session: Session, a: str, b: str) -> tuple[int, dict[str, int]]:
    """Shards a0, a1 on node `a` and b0 on node `b`, a pending ssd copy; `b` holds a replica of
    a1 on ssd (a copy the catalog made there)."""
    for node in (a, b):
        upsert_node(session, node, {})
    job_id = session.scalar(
        insert(Job).values(name=f"job-{uuid.uuid4().hex[:10]}").returning(Job.id)
    )
    cp = session.scalar(
        insert(Checkpoint)
        .values(job_id=job_id, step=1, total_bytes=3, shard_count=3, manifest_digest="d")
        .returning(Checkpoint.id)
    )
    assert cp is not None
    ids: dict[str, int] = {}
    for i, (path, node) in enumerate([("a0", a), ("a1", a), ("b0", b)]):
        sid = session.scalar(
            insert(Shard)
            .values(checkpoint_id=cp, ordinal=i, path=path, size=1, node_id=node)
            .returning(Shard.id)
        )
        assert sid is not None
        ids[path] = sid
    session.execute(insert(TierCopy).values(checkpoint_id=cp, tier="ssd", job_id=job_id, step=1))
    session.execute(
        insert(Replica).values(
            shard_id=ids["a1"],
            checkpoint_id=cp,
            tier="ssd",
            node_id=b,
            state="verified",
            location="x",
        )
    )
    return cp, ids


def _count(session: Session, cp: int) -> int:
    return (
        session.scalar(
            select(func.count()).select_from(CachedCopy).where(CachedCopy.checkpoint_id == cp)
        )
        or 0
    )


def test_a_reader_keeps_only_files_the_catalog_has_no_copy_of_on_the_node(
    session: Session,
) -> None:
    a, b = (f"node-{uuid.uuid4().hex[:8]}" for _ in range(2))
    cp, ids = _checkpoint(session, a, b)
    wanted = {a: ["a0", "b0"], b: ["a0", "a1", "b0", "a0"]}
    assert record(session, cp, "ssd", wanted) == {a: ["b0"], b: ["a0"]}
    assert record(session, cp, "ssd", wanted) == {a: ["b0"], b: ["a0"]}  # again: nothing new
    assert _count(session, cp) == 2
    assert set(session.scalars(nodes_on(cp, "ssd"))) == {a, b}
    assert list(session.scalars(shards_on(cp, "ssd", a))) == [ids["b0"]]
    assert unknown_paths(session, cp, ["a0", "zz", "b0", "zz"]) == ["zz"]
    forget(session, cp, "ssd")
    assert _count(session, cp) == 0


def test_nothing_is_recorded_once_the_copy_is_being_expired(session: Session) -> None:
    a, b = (f"node-{uuid.uuid4().hex[:8]}" for _ in range(2))
    cp, _ids = _checkpoint(session, a, b)
    for state in (TierState.RESTORABLE, TierState.EXPIRING):
        session.execute(
            update(TierCopy).where(TierCopy.checkpoint_id == cp).values(state=state.value)
        )
    assert record(session, cp, "ssd", {a: ["b0"]}) == {}
    assert record(session, cp, "lustre", {a: ["b0"]}) == {}  # no copy on that tier at all
    assert _count(session, cp) == 0
