"""Pass 1 of the retention planner (planner.py): what never expires, whatever a tier's keep rules
say, and the states of a copy that the planner judges by (good, intact, decided by retention,
being made again).

The protections: pinned, leased, quarantined by an operator (evidence; a training job's quarantine
only makes a copy not good and protects nothing), the latest restorable checkpoint on the most
durable tier, a source of a copy still in flight to a more durable tier, a source of a copy that
re-replication or repair is making again (on any other tier, while that rebuild holds it), a
local copy not yet restorable on the more durable tier it is meant for, and every remnant of a
checkpoint that some tier keeps but that has no good copy left. Pure, like the planner.
"""

from __future__ import annotations

from collections.abc import Sequence

from tierpoint.states import TierState
from tierpoint.tier_config import TierKind

from .models import CheckpointInfo, KeepReason, TierCopy
from .policy import TierRef

# Tiers on the nodes' own storage, where a lost node leaves failed copies behind.
NODE_TIER_KINDS = (TierKind.LOCAL, TierKind.PEER)


def is_good(c: CheckpointInfo, copy: TierCopy | None) -> bool:
    """A copy a job could restore from: promoted, fully verified, not quarantined."""
    return (
        copy is not None
        and copy.state == TierState.RESTORABLE
        and copy.verified
        and not copy.quarantined
        and not c.quarantined
    )


def is_intact(copy: TierCopy | None) -> bool:
    """A copy whose bytes are safe: promoted, fully verified, the copy itself not quarantined. A
    good copy is intact; so is one of a checkpoint a training job quarantined (its bytes are
    fine, its content is what the job refused): no other copy need wait or stay for its sake."""
    return (
        copy is not None
        and copy.state == TierState.RESTORABLE
        and copy.verified
        and not copy.quarantined
    )


def decided(kind: TierKind, copy: TierCopy) -> bool:
    """Whether retention decides the copy: a restorable one, or a failed one on a node tier that
    a lost node took part of, unless it is being made again (in flight, as a pending one)."""
    if copy.state == TierState.FAILED:
        # guard: planner-failed-copy-needs-a-lost-node
        # guard: planner-rebuilt-copy-in-flight
        return copy.on_lost_node and kind in NODE_TIER_KINDS and not rebuilding(copy)
    return copy.state == TierState.RESTORABLE


def rebuilding(copy: TierCopy) -> bool:
    """A failed copy that re-replication or repair is making again: its rebuild holds sources (a
    quarantined copy is re-made by neither)."""
    return copy.state == TierState.FAILED and bool(copy.rebuild_from) and not copy.quarantined


def newest_good(checkpoints: Sequence[CheckpointInfo]) -> int | None:
    """The id of the job's newest checkpoint with a good verdict that is not quarantined (on the
    timeline before any superseded one: `checkpoints` come oldest first, superseded first)."""
    good = [c for c in checkpoints if c.good and not c.quarantined]
    return good[-1].id if good else None


def protections(
    c: CheckpointInfo,
    index: int,
    tiers: Sequence[TierRef],
    targets: set[str],
    keepers: set[int],
    latest_durable: int | None,
    newest_good_id: int | None = None,
) -> list[KeepReason]:
    """Why the checkpoint's copy on `tiers[index]` may not expire, whatever the keep rules say:
    `targets` are the tiers it is meant for, `keepers` the tiers whose rules keep it,
    `latest_durable` the id of the latest checkpoint restorable on the most durable tier and
    `newest_good_id` the job's newest good one (`newest_good`)."""
    t = tiers[index]
    why = []
    if c.id == newest_good_id:
        # guard: planner-newest-good
        why.append(KeepReason.NEWEST_GOOD)
    if c.child_needs:
        # guard: planner-fork-parent
        why.append(KeepReason.FORK_PARENT)
    if c.pinned:
        # guard: planner-pinned
        why.append(KeepReason.PINNED)
    if c.leased:
        # guard: planner-leased
        why.append(KeepReason.LEASED)
    copy = c.copies[t.name]
    # guard: planner-quarantine-evidence-only
    if (c.quarantined and c.evidence) or (copy.quarantined and copy.evidence):
        # guard: planner-quarantined
        why.append(KeepReason.QUARANTINED)
    if index == len(tiers) - 1 and c.id == latest_durable:
        # guard: planner-latest-durable
        why.append(KeepReason.LATEST_DURABLE)
    slower = tiers[index + 1 :]
    # A pending copy on a tier the checkpoint is not meant for (the policy changed, or a tier copy
    # was made for every tier) is no copy anyone waits for: it must not hold sources forever.
    if any(
        u.name in c.copies and c.copies[u.name].state == TierState.PENDING and u.name in targets
        for u in slower
    ):
        # guard: planner-in-flight
        why.append(KeepReason.IN_FLIGHT)
    if (
        t.kind is TierKind.LOCAL
        and any(u.name in targets and expects(c, u.name) for u in slower)
        and not any(is_intact(c.copies.get(u.name)) for u in slower)
    ):
        # guard: planner-awaiting-durable
        why.append(KeepReason.AWAITING_DURABLE)
    # The mirror of in_flight: a failed copy on another tier (a peer tier after a lost holder, a
    # copy repair re-makes) is being made again from this one, whichever side of it that tier is.
    # Only while the rebuild is under way: its promotion (made or given up) clears the hold and a
    # rebuild that stopped without one lets it lapse, so a copy that can no longer be re-made
    # does not hold its sources forever.
    # A coded copy cut again from its own stripes holds itself, whatever its state.
    if any(
        t.name in other.rebuild_from and (rebuilding(other) or name == t.name)
        for name, other in c.copies.items()
    ):
        # guard: planner-rebuild-source
        why.append(KeepReason.REBUILD_SOURCE)
    if keepers and not any(is_intact(c.copies.get(u.name)) for u in tiers):
        # guard: planner-no-good-copy
        why.append(KeepReason.NO_GOOD_COPY)
    return why


def expects(c: CheckpointInfo, tier: str) -> bool:
    """The tier has not received the checkpoint and let it go again (tier copy expiring/expired)."""
    copy = c.copies.get(tier)
    return copy is None or copy.state not in (TierState.EXPIRING, TierState.EXPIRED)
