"""Small builders for retention snapshots, and a simulator that applies plans the way the executor
will (marker -> expired), so that tests can replay a job's history."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from tests.helpers.planner_invariants import targets
from tierpoint.retention import (
    CheckpointInfo,
    Policy,
    RetentionPlan,
    RetentionSnapshot,
    TierCopy,
    TierRef,
    plan,
)
from tierpoint.states import TierState
from tierpoint.tier_config import TierKind

TIERS = (
    TierRef("ssd", TierKind.LOCAL),
    TierRef("lustre", TierKind.SHARED),
    TierRef("s3", TierKind.S3),
)
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def good(nbytes: int = 100) -> TierCopy:
    return TierCopy(state=TierState.RESTORABLE, verified=True, bytes=nbytes)


def checkpoint(
    step: int,
    tiers: dict[str, TierCopy],
    *,
    created_at: datetime | None = None,
    total_bytes: int = 100,
    **kw: object,
) -> CheckpointInfo:
    return CheckpointInfo(
        id=1000 + step,
        step=step,
        created_at=created_at or T0 + timedelta(hours=step),
        total_bytes=total_bytes,
        copies=tiers,
        **kw,
    )


def snapshot(*checkpoints: CheckpointInfo, tiers: tuple[TierRef, ...] = TIERS) -> RetentionSnapshot:
    return RetentionSnapshot(job="job", tiers=tiers, checkpoints=checkpoints)


def apply(snap: RetentionSnapshot, p: RetentionPlan) -> RetentionSnapshot:
    """The executor's effect: every planned or unfinished expiry ends with the marker expired."""
    gone = {(e.checkpoint_id, e.tier) for e in p.expiries}
    gone |= {(u.checkpoint_id, u.tier) for u in p.unfinished}
    out = []
    for c in snap.checkpoints:
        copies = {
            name: (
                TierCopy(state=TierState.EXPIRED, verified=False, bytes=0)
                if (c.id, name) in gone
                else copy
            )
            for name, copy in c.copies.items()
        }
        out.append(c.model_copy(update={"copies": copies}))
    return snap.model_copy(update={"checkpoints": tuple(out)})


def holding(snap: RetentionSnapshot) -> dict[str, list[int]]:
    """tier -> steps with a restorable copy there."""
    return {
        t.name: sorted(
            c.step
            for c in snap.checkpoints
            if t.name in c.copies and c.copies[t.name].state == TierState.RESTORABLE
        )
        for t in snap.tiers
    }


Check = Callable[[RetentionSnapshot, Policy, datetime, RetentionPlan], None]


def run_history(
    policy: Policy,
    steps: list[int],
    *,
    nbytes: int = 100,
    tiers: tuple[TierRef, ...] = TIERS,
    check: Check | None = None,
    pinned: frozenset[int] = frozenset(),
    fails: dict[int, str] | None = None,
) -> RetentionSnapshot:
    """Register each step, promote it tier by tier to its targets (each copy pending first), and
    run retention at every change, as the lifecycle workflow will. `fails` maps a step to the tier
    whose copy fails: its marker becomes failed and the step goes no further."""
    snap = snapshot(tiers=tiers)
    for n, step in enumerate(steps):
        now = T0 + timedelta(hours=n)
        c = CheckpointInfo(
            id=1000 + step, step=step, created_at=now, total_bytes=nbytes, pinned=step in pinned
        )
        snap = snap.model_copy(update={"checkpoints": (*snap.checkpoints, c)})
        for name in targets(policy, tiers, step):
            if name != tiers[0].name:
                snap = _set_copy(
                    snap, c.id, name, TierCopy(state=TierState.PENDING, verified=False, bytes=0)
                )
                snap = _retain(snap, policy, now, check)
            failed = (fails or {}).get(step) == name
            state = TierState.FAILED if failed else TierState.RESTORABLE
            snap = _set_copy(
                snap, c.id, name, TierCopy(state=state, verified=not failed, bytes=nbytes)
            )
            snap = _retain(snap, policy, now, check)
            if failed:
                break
    return snap


def _retain(
    snap: RetentionSnapshot, policy: Policy, now: datetime, check: Check | None
) -> RetentionSnapshot:
    p = plan(snap, policy, now)
    if check is not None:
        check(snap, policy, now, p)
    return apply(snap, p)


def _set_copy(snap: RetentionSnapshot, cid: int, tier: str, copy: TierCopy) -> RetentionSnapshot:
    out = tuple(
        c.model_copy(update={"copies": {**c.copies, tier: copy}}) if c.id == cid else c
        for c in snap.checkpoints
    )
    return snap.model_copy(update={"checkpoints": out})
