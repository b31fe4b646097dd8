"""A coded peer tier (rs(2,1)) in the catalog for the operator views' tests: holders of the
test's own, the settings with the tier, and a promoted coded copy with one stripe found bad."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session
from tierpoint_client.erasure import Code

from tierpoint.catalog.models import Checkpoint, Job, Node, Shard
from tierpoint.catalog.node.registry import upsert_node
from tierpoint.catalog.stripe import machine as stripes
from tierpoint.catalog.tier_copy.promotion import promote
from tierpoint.catalog.tier_copy.stripe_damage import mark_stripes_damaged
from tierpoint.config import Settings
from tierpoint.states import ReplicaState
from tierpoint.tier_config import TierConfig, TierKind

CODE = Code(2, 1)
PRICE = 0.5


@contextmanager
def own_holders(catalog: Engine) -> Iterator[list[str]]:
    """k+m nodes of the test's own to hold stripes (and for the API's start to count); declared
    lost afterwards, so that no other test places anything on them."""
    tag = uuid.uuid4().hex[:8]
    names = [f"holder{i}-{tag}" for i in range(CODE.width)]
    with Session(catalog) as s:
        for n in names:
            upsert_node(s, n, {})
        s.commit()
    try:
        yield names
    finally:
        with Session(catalog) as s:
            s.execute(update(Node).where(Node.id.in_(names)).values(lost_at=Node.last_seen_at))
            s.commit()


def with_coded_tier(settings: Settings) -> Settings:
    """`coded` after the local tier, priced at PRICE."""
    ssd, *rest = settings.tiers
    coded = TierConfig(
        name="coded",
        kind=TierKind.PEER,
        root="/nowhere/{node}/coded",
        code=str(CODE),
        price_per_gb_month=PRICE,
    )
    return settings.model_copy(update={"tiers": [ssd, coded, *rest]})


def coded_copy(catalog: Engine, job: str, step: int, holders: list[str]) -> list[int]:
    """The checkpoint's stripes placed on `holders`, verified, and the coded copy promoted;
    then stripe 0 of its first shard found corrupt. Its shard ids, in manifest order."""
    with Session(catalog) as s, s.begin():
        cp = s.scalar(
            select(Checkpoint.id)
            .join(Job, Job.id == Checkpoint.job_id)
            .where(Job.name == job, Checkpoint.step == step)
        )
        assert cp is not None
        shards = list(
            s.scalars(select(Shard.id).where(Shard.checkpoint_id == cp).order_by(Shard.ordinal))
        )
        for sid in shards:
            rows = [
                stripes.PlacedStripe(sid, i, h, 10 + i, f"{i:08x}") for i, h in enumerate(holders)
            ]
            stripes.place(s, cp, "coded", str(CODE), rows)
            back = [stripes.ReadBack(sid, i, 10 + i, f"{i:08x}") for i in range(CODE.width)]
            stripes.read_back(s, "coded", back)
        assert promote(s, cp, "coded", [], None, CODE).state == "restorable"
        mark_stripes_damaged(
            s, "coded", CODE, {(shards[0], 0): "crc32c differs"}, ReplicaState.CORRUPT, "scrub"
        )
    return shards
