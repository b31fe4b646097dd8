"""The files a DCP load's ranks keep of other nodes on their own node's local tier: which ones,
and their record, made by the coordinator for every rank in one request before any rank writes
one, so that the expiry of the checkpoint's local copy deletes them (a rank keeps only what the
server recorded)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

from tierpoint_client.client import Client
from tierpoint_client.errors import TierpointError
from tierpoint_client.models import RestoreStart
from tierpoint_client.torch._files import METADATA_FILE, local_tier


@dataclass(frozen=True)
class RankNode:
    """What a rank tells the coordinator with its local plan: where it may keep files."""

    node: str | None
    repopulate: bool


def record_kept(
    client: Client,
    start: RestoreStart,
    ranks: Sequence[RankNode | None],
    reads: Sequence[set[str]],
    *,
    coordinator: str | None,
) -> dict[str, set[str]]:
    """Record the other nodes' files each rank (`ranks[i]`, reading `reads[i]`) may keep on its
    node: every file it reads that is not its node's own, and `.metadata` on the `coordinator`'s
    node (None: it keeps nothing). Returns node -> the files recorded; nothing when there is
    nothing to keep, or when the server cannot be asked (the load goes on without keeping)."""
    local = local_tier(start.tiers)
    if local is None or local.root is None:
        return {}
    owner = {s.path: s.node for s in start.checkpoint.shards or ()}
    wanted: dict[str, set[str]] = {}
    for rank, paths in zip(ranks, reads, strict=True):
        if rank is not None and rank.node is not None and rank.repopulate:
            theirs = {p for p in paths if owner.get(p) != rank.node}
            wanted.setdefault(rank.node, set()).update(theirs)
    if coordinator is not None and owner.get(METADATA_FILE) != coordinator:
        wanted.setdefault(coordinator, set()).add(METADATA_FILE)
    wanted = {n: p for n, p in wanted.items() if p}
    if not wanted:
        return {}
    try:
        return client.record_cached_copies(
            start.job, start.step, local.name, wanted, branch=start.checkpoint.branch
        )
    except TierpointError as e:
        warnings.warn(
            f"tierpoint: could not record the files this load keeps on its nodes ({e}); "
            "they are read but not kept",
            stacklevel=3,
        )
        return {}
