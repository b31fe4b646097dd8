"""The checkpoint endpoints' reads on a real catalog: one checkpoint by step (the timeline's
before a superseded one, or the one on a named branch) with its shards and replicas, and a page of
a job's checkpoints, newest first, filtered by tier and state, with a cursor that never splits a
step saved on several branches."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import insert, update
from sqlalchemy.orm import Session

from tests.helpers.catalog_rows import checkpoint_row, job_row
from tierpoint.catalog.models import Checkpoint, Shard, TierCopy
from tierpoint.catalog.node.registry import upsert_node
from tierpoint.catalog.reads.checkpoints import get_checkpoint, list_checkpoints
from tierpoint.catalog.replica.machine import ReplicaWrite, upsert_replicas
from tierpoint.errors.checkpoints import CheckpointNotFound, JobNotFound
from tierpoint.states import ReplicaState
from tierpoint.tier_config import TierConfig, TierKind

SSD = TierConfig(name="ssd", kind=TierKind.LOCAL, root="/ssd")
LUSTRE = TierConfig(name="lustre", kind=TierKind.SHARED, root="/lustre")
TIERS = [SSD, LUSTRE]


def _set_tier(session: Session, cp: int, tier: str, state: str) -> None:
    session.execute(
        update(TierCopy)
        .where(TierCopy.checkpoint_id == cp, TierCopy.tier == tier)
        .values(state=state)
    )


def _supersede(session: Session, cp: int, by_branch: int) -> None:
    session.execute(update(Checkpoint).where(Checkpoint.id == cp).values(superseded_by=by_branch))


def _page(
    session: Session,
    job: str,
    *,
    limit: int = 50,
    before_step: int | None = None,
    tier: str | None = None,
    state: str | None = None,
) -> tuple[list[tuple[int, int]], int | None]:
    """(step, branch) of each checkpoint of the page, and its cursor."""
    views, cursor = list_checkpoints(
        session, job, TIERS, tier=tier, state=state, limit=limit, before_step=before_step
    )
    return [(v.step, v.branch) for v in views], cursor


def test_a_page_is_newest_first_and_its_cursor_continues_below_it(session: Session) -> None:
    job = job_row(session)
    for step in (1, 2, 3, 4, 5):
        checkpoint_row(session, job.id, step)

    assert _page(session, job.name, limit=2) == ([(5, 1), (4, 1)], 4)
    assert _page(session, job.name, limit=2, before_step=4) == ([(3, 1), (2, 1)], 2)
    # The last page says so: no cursor to follow.
    assert _page(session, job.name, limit=2, before_step=2) == ([(1, 1)], None)
    assert _page(session, job.name, limit=5) == ([(5, 1), (4, 1), (3, 1), (2, 1), (1, 1)], None)


def test_a_step_saved_on_several_branches_is_never_split_between_pages(session: Session) -> None:
    job = job_row(session)
    checkpoint_row(session, job.id, 3)
    _supersede(session, checkpoint_row(session, job.id, 2), by_branch=2)
    checkpoint_row(session, job.id, 2, branch=2)
    checkpoint_row(session, job.id, 1)

    # A page of two would end between step 2's branches: it ends before step 2 instead, and both
    # of step 2's checkpoints come on the next page, the newest branch first.
    first, cursor = _page(session, job.name, limit=2)
    assert (first, cursor) == ([(3, 1)], 3)
    assert _page(session, job.name, limit=2, before_step=cursor) == ([(2, 2), (2, 1)], 2)
    # A step that fills a whole page is returned whole rather than not at all.
    assert _page(session, job.name, limit=1, before_step=3) == ([(2, 2)], 2)


@pytest.mark.parametrize(
    ("tier", "state", "expected"),
    [
        ("lustre", None, [3, 2]),
        (None, "restorable", [3, 1]),
        ("lustre", "restorable", [3]),
        ("ssd", "failed", [2]),
        ("s3", None, []),
    ],
)
def test_filters_by_tier_and_state_keep_the_checkpoints_with_such_a_tier_copy(
    session: Session, tier: str | None, state: str | None, expected: list[int]
) -> None:
    job = job_row(session)
    one = checkpoint_row(session, job.id, 1, tiers=("ssd",))
    _set_tier(session, one, "ssd", "restorable")
    two = checkpoint_row(session, job.id, 2, tiers=("ssd", "lustre"))
    _set_tier(session, two, "ssd", "failed")
    three = checkpoint_row(session, job.id, 3, tiers=("ssd", "lustre"))
    _set_tier(session, three, "lustre", "restorable")

    steps, cursor = _page(session, job.name, tier=tier, state=state)
    assert [s for s, _ in steps] == expected and cursor is None


def test_a_filtered_page_continues_below_its_cursor(session: Session) -> None:
    job = job_row(session)
    for step in (1, 2, 3, 4):
        cp = checkpoint_row(session, job.id, step, tiers=("lustre",))
        if step != 3:
            _set_tier(session, cp, "lustre", "restorable")
    # With both filters the tier copies' index drives the page; with one, the checkpoints'.
    for tier in ("lustre", None):
        first, cursor = _page(session, job.name, limit=2, tier=tier, state="restorable")
        assert (first, cursor) == ([(4, 1), (2, 1)], 2)
        rest = _page(session, job.name, limit=2, before_step=cursor, tier=tier, state="restorable")
        assert rest == ([(1, 1)], None)


def test_the_list_keeps_superseded_and_deleted_checkpoints_and_says_which(
    session: Session,
) -> None:
    job = job_row(session)
    gone = checkpoint_row(session, job.id, 1)
    session.execute(
        update(Checkpoint).where(Checkpoint.id == gone).values(deleted_at=Checkpoint.created_at)
    )
    old = checkpoint_row(session, job.id, 2)
    _supersede(session, old, by_branch=2)
    checkpoint_row(session, job.id, 2, branch=2)

    views, _ = list_checkpoints(session, job.name, TIERS)
    by = {(v.step, v.branch): v for v in views}
    assert sorted(by) == [(1, 1), (2, 1), (2, 2)]
    assert by[(2, 1)].superseded_by == 2 and by[(2, 2)].superseded_by is None
    assert by[(1, 1)].deleted_at is not None and by[(2, 2)].deleted_at is None


def test_an_unknown_job_is_not_found_rather_than_an_empty_page(session: Session) -> None:
    with pytest.raises(JobNotFound):
        list_checkpoints(session, f"job-{uuid.uuid4().hex[:10]}", TIERS)
    # A job with no checkpoint is an empty last page.
    assert list_checkpoints(session, job_row(session).name, TIERS) == ([], None)


def test_a_step_means_the_timelines_checkpoint_unless_a_branch_is_named(
    session: Session,
) -> None:
    job = job_row(session)
    old = checkpoint_row(session, job.id, 7)
    _supersede(session, old, by_branch=2)
    new = checkpoint_row(session, job.id, 7, branch=2)

    assert get_checkpoint(session, job.name, 7, TIERS).id == new
    assert get_checkpoint(session, job.name, 7, TIERS, branch=1).id == old
    # With only superseded checkpoints at the step, the newest of them.
    _supersede(session, new, by_branch=3)
    assert get_checkpoint(session, job.name, 7, TIERS).id == new


def test_a_missing_step_or_branch_or_job_is_not_found(session: Session) -> None:
    job = job_row(session)
    checkpoint_row(session, job.id, 1)
    with pytest.raises(CheckpointNotFound):
        get_checkpoint(session, job.name, 2, TIERS)
    with pytest.raises(CheckpointNotFound, match="on branch 2"):
        get_checkpoint(session, job.name, 1, TIERS, branch=2)
    with pytest.raises(JobNotFound):
        get_checkpoint(session, f"job-{uuid.uuid4().hex[:10]}", 1, TIERS)


def test_one_checkpoint_lists_its_shards_by_ordinal_with_replicas_in_tier_order(
    session: Session,
) -> None:
    node = f"node-{uuid.uuid4().hex[:8]}"
    upsert_node(session, node, {})
    job = job_row(session)
    cp = checkpoint_row(session, job.id, 4, tiers=("ssd", "lustre"))
    session.execute(
        update(Checkpoint).where(Checkpoint.id == cp).values(shard_count=2, total_bytes=30)
    )
    shards: dict[str, int] = {}
    # Inserted out of order: the ordinal, not the insertion, orders them.
    for ordinal, path, size in ((1, "b", 20), (0, "a", 10)):
        sid = session.scalar(
            insert(Shard)
            .values(checkpoint_id=cp, ordinal=ordinal, path=path, size=size, node_id=node)
            .returning(Shard.id)
        )
        assert sid is not None
        shards[path] = sid
    for tier in ("lustre", "ssd"):
        writes = [
            ReplicaWrite(sid, ReplicaState.VERIFIED, f"/{tier}/{p}", node, 10)
            for p, sid in shards.items()
        ]
        upsert_replicas(session, cp, tier, writes)

    detail = get_checkpoint(session, job.name, 4, TIERS)
    assert [(s.path, s.size, s.node) for s in detail.shards] == [("a", 10, node), ("b", 20, node)]
    assert [[r.tier for r in s.replicas] for s in detail.shards] == [["ssd", "lustre"]] * 2
    assert detail.shards[0].replicas[0].location == "/ssd/a"
    # No object store here: no (bucket, key) for a file tier's replica.
    assert detail.shards[0].replicas[1].bucket is None
    assert get_checkpoint(session, job.name, 4, TIERS, include_shards=False).shards == []
