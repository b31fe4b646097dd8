"""A run's timeline through the training-side client, against the real stack: a job saves steps
1 to 3, rolls back to 1 and saves 2 again in its new branch's own directory; `latest` follows the
new branch, the old step 2 stays listed as superseded; verdicts certify and quarantine; the
lineage shows the branch point; a fork starts a new job from another's checkpoint."""

from __future__ import annotations

import asyncio
import math
import uuid

import pytest
from tierpoint_client import CheckpointRef, ConflictError, build_manifest

from tests.helpers.client import Stack, write_shards

WAIT = 300.0


async def _save(stack: Stack, job: str, step: int) -> None:
    node = stack.nodes[0]
    directory = stack.local_dir(node, job, step)
    write_shards(directory, {"model.bin": 4096 + step})
    await asyncio.to_thread(stack.client.register, job, step, directory, node)
    # On the shared tier: what `latest` without a node reads.
    await stack.wait_restorable(job, step, "lustre", WAIT)


async def _save_on(
    stack: Stack, job: str, step: int, branch: int, parent: CheckpointRef | None
) -> None:
    """A step saved again on a later branch, in that branch's own directory (`<step>.b<N>`, as
    the DCP writer writes it), naming its parent."""
    node = stack.nodes[0]
    directory = stack.local_dir(node, job, step).with_name(f"{step}.b{branch}")
    write_shards(directory, {"model.bin": 4096 + step})
    shards = build_manifest(directory, node)
    await asyncio.to_thread(
        stack.client.register_manifest, job, step, shards, branch=branch, parent=parent
    )
    await stack.wait_restorable(job, step, "lustre", WAIT)


async def test_rollback_branch_resave_latest_verdicts_and_lineage(stack: Stack) -> None:
    client, job = stack.client, f"tl-{uuid.uuid4().hex[:8]}"
    for step in (1, 2, 3):
        await _save(stack, job, step)

    done = await asyncio.to_thread(client.rollback, job, 1, from_branch=1, reason="loss spike")
    assert done.created and done.branch.number == 2 and done.branch.from_step == 1
    assert sorted(done.superseded) == [2, 3]
    again = await asyncio.to_thread(client.rollback, job, 1, from_branch=1)
    assert (again.created, again.branch.number, again.superseded) == (False, 2, ())
    branches = await asyncio.to_thread(client.branches, job)
    assert branches.current == 2 and [b.number for b in branches.items] == [1, 2]

    latest = await asyncio.to_thread(client.latest, job)
    assert latest is not None and (latest.step, latest.checkpoint.branch) == (1, 1)
    old2 = await asyncio.to_thread(client.checkpoint, job, 2)
    assert old2.superseded_by == 2

    one = CheckpointRef(job, 1)
    await _save_on(stack, job, 2, 2, one)
    latest = await asyncio.to_thread(client.latest, job)
    assert latest is not None and (latest.step, latest.checkpoint.branch) == (2, 2)
    assert latest.checkpoint.parent is not None and latest.checkpoint.parent.step == 1
    on_old = await asyncio.to_thread(client.latest, job, branch=1)
    assert on_old is not None and (on_old.step, on_old.checkpoint.branch) == (3, 1)

    # Certified good: what `health="good"` answers; bad: quarantined, never latest again.
    assert await asyncio.to_thread(client.latest, job, health="good") is None
    good = await asyncio.to_thread(client.give_verdict, job, 1, "good", metric="loss", value=0.9)
    assert good.health is not None and good.health.verdict == "good"
    bad = await asyncio.to_thread(
        client.give_verdict, job, 2, "bad", metric="loss", value=math.nan, at_step=2
    )
    assert bad.health is not None and bad.health.verdict == "bad"
    assert bad.health.value is not None and math.isnan(bad.health.value)
    assert bad.quarantine_reason
    with pytest.raises(ConflictError) as e:
        await asyncio.to_thread(client.give_verdict, job, 2, "good")
    assert e.value.code == "verdict_conflict"
    latest = await asyncio.to_thread(client.latest, job)
    assert latest is not None and latest.step == 1
    certified = await asyncio.to_thread(client.latest, job, health="good")
    assert certified is not None and certified.step == 1

    lineage = await asyncio.to_thread(client.lineage, job, 2, branch=2)
    assert (lineage.checkpoint.step, lineage.checkpoint.branch) == (2, 2)
    assert [(a.step, a.branch) for a in lineage.ancestors] == [(1, 1)]
    below = await asyncio.to_thread(client.lineage, job, 1)
    assert {(d.step, d.branch, d.superseded) for d in below.descendants} >= {
        (2, 2, False),
        (2, 1, True),
    }


async def test_a_fork_starts_a_job_from_another_jobs_checkpoint(stack: Stack) -> None:
    client = stack.client
    parent, child = f"pre-{uuid.uuid4().hex[:8]}", f"sft-{uuid.uuid4().hex[:8]}"
    await _save(stack, parent, 5)
    fork = await asyncio.to_thread(client.fork, child, CheckpointRef(parent, 5))
    assert fork.created and (fork.parent.job, fork.parent.step) == (parent, 5)
    again = await asyncio.to_thread(client.fork, child, CheckpointRef(parent, 5))
    assert not again.created
    # The child's first load reads the parent's copy where it is.
    first = await asyncio.to_thread(client.latest, child)
    assert first is not None and (first.job, first.step, first.fork_parent) == (parent, 5, True)
