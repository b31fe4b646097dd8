"""A restore plan's coded copies: per shard the stripes a restore may read, each at its holder's
data endpoint, offered only when every shard has at least k of them."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from tierpoint.catalog.models import RESTORABLE, Shard
from tierpoint.catalog.node import registry
from tierpoint.catalog.reads.views import CheckpointDetailView, PlanStripe
from tierpoint.catalog.stripe.restoring import restorable_stripes
from tierpoint.storage.base import ShardRef
from tierpoint.storage.peer_http import stripe_url
from tierpoint.tier_config import TierConfig

# Shard id -> the stripes of it a restore may read
CodedCopy = dict[int, list[PlanStripe]]


def coded_copies(
    session: Session,
    checkpoint_id: int,
    tiers: Sequence[TierConfig],
    shards: dict[int, str],
    ref: tuple[str, int, int],
) -> dict[str, CodedCopy]:
    """Tier name -> its coded copy of the checkpoint as a restore reads it, for each coded tier
    of `tiers` on which every shard of `shards` (id -> path) has at least k stripes verified on
    holders that are not declared lost and serve an endpoint now; a tier short of k for some
    shard is left out, so the plan names the next tier (`ref`: job, step, branch)."""
    job, step, branch = ref
    out: dict[str, CodedCopy] = {}
    for tier in tiers:
        code = tier.stripe_code
        if code is None:
            continue
        held = restorable_stripes(session, checkpoint_id, tier.name)
        urls = registry.data_urls(session, {h.node for hs in held.values() for h in hs})
        copy: CodedCopy = {}
        for shard_id, path in shards.items():
            shard = ShardRef(job, step, path, branch)
            copy[shard_id] = [
                PlanStripe(
                    h.index,
                    h.node,
                    stripe_url(urls[h.node], tier.name, h.index, shard),
                    h.size,
                    h.crc32c,
                )
                for h in held.get(shard_id, [])
                if h.node in urls
            ]
        if all(len(stripes) >= code.k for stripes in copy.values()):
            out[tier.name] = copy
    return out


def restore_coded_copies(
    session: Session,
    detail: CheckpointDetailView,
    tiers: Sequence[TierConfig],
) -> dict[str, tuple[str, dict[str, list[PlanStripe]]]]:
    """What a restore's start sends a reader that reads file by file (`TierpointReader`): per
    coded tier whose copy of the checkpoint is restorable and not quarantined, its code and, per
    file path, the stripes it may read, as the restore plan offers them (`coded_copies`). A
    coded tier keeps stripes, not replicas: its copy is among no shard's replicas."""
    usable = {t.tier for t in detail.tiers if t.state == RESTORABLE and not t.quarantine_reason}
    coded = [t for t in tiers if t.stripe_code is not None and t.name in usable]
    if not coded:
        return {}
    shards = {
        r.id: r.path
        for r in session.execute(
            select(Shard.id, Shard.path).where(Shard.checkpoint_id == detail.id)
        )
    }
    ref = (detail.job, detail.step, detail.branch)
    codes = {t.name: str(t.stripe_code) for t in coded}
    return {
        tier: (codes[tier], {shards[shard_id]: stripes for shard_id, stripes in copy.items()})
        for tier, copy in coded_copies(session, detail.id, coded, shards, ref).items()
    }
