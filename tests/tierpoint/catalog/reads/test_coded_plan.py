"""A restore plan's coded copies (catalog/reads/coded_plan.py), on a real catalog: each shard's
stripes at their holders' data endpoints, offered only while every shard has k of them on
holders that serve one."""

from __future__ import annotations

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from tests.helpers.stripe_rows import (
    CODE,
    TIER,
    names,
    placed_checkpoint,
    read_back_all,
    tier_copy,
)
from tierpoint.catalog.models import RESTORABLE, Checkpoint, Job, Node, TierCopy
from tierpoint.catalog.reads.checkpoints import get_checkpoint
from tierpoint.catalog.reads.coded_plan import coded_copies, restore_coded_copies
from tierpoint.tier_config import TierConfig, TierKind

CODED = TierConfig(name=TIER, kind=TierKind.PEER, root="/mem/{node}", code=str(CODE))


def test_a_coded_copy_is_offered_with_k_stripes_served_and_not_below(session: Session) -> None:
    cp, shards, holders = placed_checkpoint(session, 2)
    read_back_all(session, shards)
    job, step, branch = session.execute(
        select(Job.name, Checkpoint.step, Checkpoint.branch)
        .join(Job, Job.id == Checkpoint.job_id)
        .where(Checkpoint.id == cp)
    ).one()
    paths = {shards[0]: "f0", shards[1]: "f1"}

    def serving(nodes: list[str]) -> None:
        session.execute(update(Node).where(Node.id.in_(holders)).values(data_url=None))
        for n in nodes:
            session.execute(update(Node).where(Node.id == n).values(data_url=f"http://{n}:1"))

    # k holders serve an endpoint: offered with those k stripes, each at its holder's URL.
    serving(holders[: CODE.k])
    got = coded_copies(session, cp, [CODED], paths, (job, step, branch))
    first = got[TIER][shards[0]]
    assert [s.index for s in first] == list(range(CODE.k))
    assert first[1].url == f"http://{holders[1]}:1/v1/data/{TIER}~1/{job}/{step}/f0"
    assert (first[1].size, first[1].crc32c) == (101, "00000001")

    # One fewer: no shard has k stripes that a restore could read, so the tier is not offered.
    serving(holders[: CODE.k - 1])
    assert coded_copies(session, cp, [CODED], paths, (job, step, branch)) == {}


def test_a_quarantined_coded_copy_is_offered_to_no_reader(session: Session) -> None:
    """An operator's quarantine of the coded tier's copy (its stripes suspect) keeps every
    reader off it, as for a full copy: `TierpointReader`'s restore start lists it no more, and
    lifting the quarantine offers it again."""
    cp, shards, holders = placed_checkpoint(session, 2)
    read_back_all(session, shards)
    tier_copy(session, cp)
    session.execute(
        update(TierCopy)
        .where(TierCopy.checkpoint_id == cp, TierCopy.tier == TIER)
        .values(state=RESTORABLE)
    )
    for n in holders:
        session.execute(update(Node).where(Node.id == n).values(data_url=f"http://{n}:1"))
    job, _ = names(session, cp)

    def offered() -> set[str]:
        detail = get_checkpoint(session, job, 1, [CODED])
        return set(restore_coded_copies(session, detail, [CODED]))

    assert offered() == {TIER}
    session.execute(
        update(TierCopy)
        .where(TierCopy.checkpoint_id == cp, TierCopy.tier == TIER)
        .values(quarantine_reason="stripes suspect")
    )
    assert offered() == set()
    session.execute(
        update(TierCopy)
        .where(TierCopy.checkpoint_id == cp, TierCopy.tier == TIER)
        .values(quarantine_reason=None)
    )
    assert offered() == {TIER}
