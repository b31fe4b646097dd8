"""What a restore reads of a coded copy (catalog/stripe/restoring.py), on a real catalog: only
stripes verified on holders not declared lost, in the plan and at a holder's data endpoint."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from tests.helpers.stripe_rows import CODE, TIER, placed_checkpoint
from tierpoint.catalog.models import Checkpoint, Job
from tierpoint.catalog.stripe import machine as stripes
from tierpoint.catalog.stripe.restoring import held_size, restorable_stripes
from tierpoint.catalog.tier_copy.node_lost import mark_lost


def test_only_stripes_verified_on_holders_not_lost_are_read(session: Session) -> None:
    cp, shards, holders = placed_checkpoint(session, 2)
    # Stripe 1 of the first shard reads back wrong (corrupt); the rest match the encoder.
    results = [
        stripes.ReadBack(s, i, 100 + i, "bad00000" if (s, i) == (shards[0], 1) else f"{i:08x}")
        for s in shards
        for i in range(CODE.width)
    ]
    stripes.read_back(session, TIER, results)
    mark_lost(session, holders[2], ["ssd"], "test")

    got = restorable_stripes(session, cp, TIER)
    assert [h.index for h in got[shards[0]]] == [0, 3, 4, 5]
    assert [h.index for h in got[shards[1]]] == [0, 1, 3, 4, 5]
    assert {h.node for hs in got.values() for h in hs} == set(holders) - {holders[2]}
    assert got[shards[1]][0].size == 100 and got[shards[1]][0].crc32c == "00000000"

    job, step, branch = session.execute(
        select(Job.name, Checkpoint.step, Checkpoint.branch)
        .join(Job, Job.id == Checkpoint.job_id)
        .where(Checkpoint.id == cp)
    ).one()

    def size(node: str, index: int, path: str = "f0") -> int | None:
        return held_size(session, node, TIER, index, job, step, branch, path)

    assert size(holders[0], 0) == 100
    assert size(holders[1], 1) is None  # corrupt
    assert size(holders[2], 2) is None  # its holder lost
    assert size(holders[0], 1) is None  # not the stripe this holder holds
    assert size(holders[3], 3, "f9") is None  # no such shard
