"""Recording the files a load's ranks keep on their nodes' local tier (see
`tierpoint/catalog/replica/cached_copies.py`): the one request a DCP load's coordinator makes for
all its
ranks, before any of them writes such a file."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tierpoint.catalog.engine import Session
from tierpoint.catalog.job.lookup import find_checkpoint
from tierpoint.catalog.node import registry
from tierpoint.catalog.replica import cached_copies
from tierpoint.config import Settings
from tierpoint.errors import RequestInvalid
from tierpoint.tier_config import TierKind

EXAMPLES = 5


def record_cached_copies(
    session: Session,
    settings: Settings,
    job: str,
    step: int,
    tier: str,
    wanted: Mapping[str, Sequence[str]],
    branch: int | None = None,
) -> dict[str, list[str]]:
    """Record node -> paths as files readers keep on those nodes' `tier`; what was recorded.
    Refuses (changing nothing) a tier that is not local (UnknownTier, RequestInvalid), a node no
    worker reported from (UnknownNode), a path that is no shard of the checkpoint
    (RequestInvalid), an unknown checkpoint (JobNotFound, CheckpointNotFound). `branch`: the
    checkpoint saved at the step on that branch (`locks.at_step`)."""
    if settings.tier(tier, location="body").kind is not TierKind.LOCAL:
        raise RequestInvalid(
            f"tier {tier!r} is not a local tier: readers keep copies on a node's local tier",
            errors=[{"field": "tier", "location": "body", "message": "not a local tier"}],
        )
    for node in sorted(wanted):
        registry.require_known(session, node)
    checkpoint = find_checkpoint(session, job, step, branch=branch)
    unknown = cached_copies.unknown_paths(
        session, checkpoint.id, [p for paths in wanted.values() for p in paths]
    )
    if unknown:
        raise RequestInvalid(
            f"{len(unknown)} path(s) are no file of {job}/{step}: "
            + ", ".join(repr(p) for p in unknown[:EXAMPLES]),
            errors=[{"field": "copies", "location": "body", "message": "not a shard's path"}],
        )
    return cached_copies.record(session, checkpoint.id, tier, wanted)
