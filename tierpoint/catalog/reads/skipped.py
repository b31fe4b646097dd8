"""Why each checkpoint newer than the one "latest" chose was not chosen: one reason per tier
considered (`reads/latest.py`)."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select, tuple_
from sqlalchemy.orm import Session

from tierpoint.catalog.models import RESTORABLE, VERIFIED, Checkpoint, Replica, Shard, TierCopy
from tierpoint.catalog.reads.views import SkippedStep
from tierpoint.catalog.timeline.verdicts import GOOD
from tierpoint.states import ReplicaState, TierState
from tierpoint.tier_config import TierConfig, TierKind

if TYPE_CHECKING:
    from tierpoint.catalog.reads.latest import Timeline


def _tier_reason(
    t: TierConfig,
    tier_copy: Any,
    counts: dict[str, int],
    shard_count: int,
    nodes: list[str],
    node: str | None,
) -> str:
    name = t.name
    if tier_copy is None:
        return f"{name}: not copied to this tier"
    if tier_copy.quarantine_reason is not None:
        return f"{name}: quarantined: {tier_copy.quarantine_reason}"
    verified = counts.get(VERIFIED, 0)
    bad = {
        s: n
        for s, n in counts.items()
        if s not in (VERIFIED, ReplicaState.PENDING.value, ReplicaState.COPYING.value) and n
    }
    bad_text = "".join(f", {n} {s}" for s, n in sorted(bad.items()))
    if tier_copy.state == TierState.PENDING.value:
        started = verified + counts.get(ReplicaState.COPYING.value, 0)
        what = "copying" if started else "pending"
        return f"{name}: {what}, {verified}/{shard_count} shards verified{bad_text}"
    if tier_copy.state == TierState.FAILED.value:
        return f"{name}: failed: {tier_copy.reason or 'no reason recorded'}"
    if tier_copy.state != RESTORABLE:
        return f"{name}: {tier_copy.state}"
    if t.kind is TierKind.LOCAL:
        if node is None:
            return f"{name}: node-local copy; pass node= to restore from it"
        if nodes and nodes != [node]:
            if node not in nodes:
                return f"{name}: only on nodes {', '.join(nodes)} (caller {node})"
            return f"{name}: spread over nodes {', '.join(nodes)}, not all on caller {node}"
    if bad:
        return f"{name}: restorable but{bad_text[1:]} replicas"
    if verified < shard_count:
        return (
            f"{name}: restorable but only {verified}/{shard_count} shards have a verified replica"
        )
    return f"{name}: became restorable while this request ran"


def skipped_above(
    session: Session,
    job_id: int,
    above: int | None,
    sources: Sequence[TierConfig],
    explain: Sequence[TierConfig],
    node: str | None,
    limit: int,
    timeline: Timeline,
) -> list[SkippedStep]:
    q = select(
        Checkpoint.id,
        Checkpoint.step,
        Checkpoint.quarantine_reason,
        Checkpoint.shard_count,
        Checkpoint.health,
    )
    q = q.where(Checkpoint.job_id == job_id, dataclasses.replace(timeline, good=False).where())
    if above is not None:
        q = q.where(Checkpoint.step > above)
    rows = session.execute(q.order_by(Checkpoint.step.desc()).limit(limit + 1)).all()
    examined = rows[:limit]
    if not examined:
        return []
    ids = [r.id for r in examined]
    names = [t.name for t in explain]
    tier_copies: dict[tuple[int, str], Any] = {
        (m.checkpoint_id, m.tier): m
        for m in session.execute(
            select(
                TierCopy.checkpoint_id,
                TierCopy.tier,
                TierCopy.state,
                TierCopy.reason,
                TierCopy.quarantine_reason,
            ).where(TierCopy.checkpoint_id.in_(ids), TierCopy.tier.in_(names))
        )
    }
    counts: dict[tuple[int, str], dict[str, int]] = defaultdict(dict)
    if tier_copies:
        for c in session.execute(
            select(Replica.checkpoint_id, Replica.tier, Replica.state, func.count())
            .where(tuple_(Replica.checkpoint_id, Replica.tier).in_(list(tier_copies)))
            .group_by(Replica.checkpoint_id, Replica.tier, Replica.state)
        ):
            counts[(c[0], c[1])][c[2]] = int(c[3])
    local_restorable = [
        cid
        for (cid, tier), m in tier_copies.items()
        if m.state == RESTORABLE
        and any(t.name == tier and t.kind is TierKind.LOCAL for t in explain)
    ]
    nodes: dict[int, list[str]] = defaultdict(list)
    if local_restorable and node is not None:
        for n in session.execute(
            select(Shard.checkpoint_id, Shard.node_id)
            .where(Shard.checkpoint_id.in_(local_restorable))
            .distinct()
            .order_by(Shard.checkpoint_id, Shard.node_id)
        ):
            nodes[n.checkpoint_id].append(n.node_id)
    skipped = []
    for r in examined:
        if r.quarantine_reason is not None:
            skipped.append(SkippedStep(r.step, [f"quarantined: {r.quarantine_reason}"]))
            continue
        if timeline.good and r.health != GOOD:
            # Not certified good: that alone is why, whatever its copies.
            skipped.append(SkippedStep(r.step, [f"health: {r.health or 'no verdict'}"]))
            continue
        reasons = [
            _tier_reason(
                t,
                tier_copies.get((r.id, t.name)),
                counts.get((r.id, t.name), {}),
                r.shard_count,
                nodes.get(r.id, []),
                node if t in sources else None,
            )
            for t in explain
        ]
        skipped.append(SkippedStep(r.step, reasons))
    if len(rows) > limit:
        cut = rows[limit].step
        skipped.append(
            SkippedStep(
                cut,
                [
                    f"not examined: only the {limit} newest checkpoints above the chosen one are "
                    f"explained; step {cut} and older ones were not"
                ],
            )
        )
    return skipped
