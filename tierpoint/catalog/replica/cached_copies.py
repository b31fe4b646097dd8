"""The files a reader writes on a node's local tier beside the node's own files of a checkpoint
(`models.CachedCopy`): recorded before they are written, deleted by the expiry of the
checkpoint's copy on that tier.

A DCP load's coordinator records, in one request, the files each of its ranks may keep on its
node: files of the checkpoint the catalog holds no copy of on that node's tier. A record is taken
only while the checkpoint's copy on the tier is not being expired, and under the checkpoint row's
key-share lock, which an expiry's begin (and an admin's delete) waits for before it flips the
tier copy to `expiring`: so either the record commits first and the expiry deletes these files with
the node's own, or the flip does and the record is refused (the reader then writes nothing).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sqlalchemy import Select, delete, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session

from tierpoint.catalog.locks import RowLock, lock_checkpoint
from tierpoint.catalog.models import CachedCopy, Replica, Shard, TierCopy
from tierpoint.states import TierState

# The tier copy states whose copy no expiry has begun to delete: a file recorded now is deleted
# by the expiry to come.
_RECORDABLE = (TierState.PENDING.value, TierState.RESTORABLE.value, TierState.FAILED.value)


def record(
    session: Session, checkpoint_id: int, tier: str, wanted: Mapping[str, Sequence[str]]
) -> dict[str, list[str]]:
    """Record the files (node -> paths, every path a shard of the checkpoint) that readers may
    keep on those nodes' `tier`; returns node -> the paths recorded (those already recorded
    included). Left out: a node's own files and the files of which it holds a replica on the
    tier (the catalog's own copies, deleted with the copy anyway), and everything once the copy
    on the tier is `expiring` or `expired` (or has no tier copy). Idempotent; the caller commits."""
    lock_checkpoint(session, checkpoint_id, RowLock.NO_KEY_UPDATE)
    state = session.scalar(
        select(TierCopy.state).where(TierCopy.checkpoint_id == checkpoint_id, TierCopy.tier == tier)
    )
    if state not in _RECORDABLE:
        return {}
    paths = {p for ps in wanted.values() for p in ps}
    shards = {
        r.path: (r.id, r.node_id)
        for r in session.execute(
            select(Shard.path, Shard.id, Shard.node_id).where(
                Shard.checkpoint_id == checkpoint_id, Shard.path.in_(sorted(paths))
            )
        )
    }
    held: set[tuple[int, str | None]] = {
        (shard_id, node_id)
        for shard_id, node_id in session.execute(
            select(Replica.shard_id, Replica.node_id).where(
                Replica.checkpoint_id == checkpoint_id, Replica.tier == tier
            )
        )
    }
    out: dict[str, list[str]] = {}
    rows = []
    for node, node_paths in sorted(wanted.items()):
        for path in sorted(set(node_paths)):
            shard_id, shard_node = shards[path]
            if shard_node == node or (shard_id, node) in held:
                continue
            rows.append(
                {
                    "shard_id": shard_id,
                    "tier": tier,
                    "node_id": node,
                    "checkpoint_id": checkpoint_id,
                }
            )
            out.setdefault(node, []).append(path)
    if rows:
        session.execute(pg_insert(CachedCopy).values(rows).on_conflict_do_nothing())
    return out


def unknown_paths(session: Session, checkpoint_id: int, paths: Sequence[str]) -> list[str]:
    """The paths that are no shard of the checkpoint."""
    known = set(
        session.scalars(
            select(Shard.path).where(
                Shard.checkpoint_id == checkpoint_id, Shard.path.in_(sorted(set(paths)))
            )
        )
    )
    return sorted(set(paths) - known)


def shards_on(checkpoint_id: int, tier: str, node: str) -> Select[int]:
    """The shards of which readers keep a copy on `node`'s `tier` (a subquery)."""
    return select(CachedCopy.shard_id).where(
        CachedCopy.checkpoint_id == checkpoint_id,
        CachedCopy.tier == tier,
        CachedCopy.node_id == node,
    )


def nodes_on(checkpoint_id: int, tier: str) -> Select[str]:
    """The nodes on whose `tier` readers keep copies of the checkpoint's files (a subquery)."""
    return select(CachedCopy.node_id).where(
        CachedCopy.checkpoint_id == checkpoint_id, CachedCopy.tier == tier
    )


def forget(session: Session, checkpoint_id: int, tier: str) -> None:
    """The copy on the tier is expired: its cached files were deleted with it."""
    session.execute(
        delete(CachedCopy).where(CachedCopy.checkpoint_id == checkpoint_id, CachedCopy.tier == tier)
    )
