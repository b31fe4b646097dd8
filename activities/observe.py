"""What the lifecycle activities report besides the catalog: one log line per batch and per
promotion (the activity binds the checkpoint's job, step, tier and node), and the promotion lag."""

from __future__ import annotations

from tierpoint import logs
from tierpoint import metrics_worker as metrics
from tierpoint.catalog.job.lookup import CheckpointHead
from tierpoint.catalog.tier_copy.promotion import PromoteOutcome
from tierpoint.contract.lifecycle import BatchResult
from tierpoint.states import TierState

log = logs.get("activities.lifecycle")


def batch(event: str, result: BatchResult, **extra: object) -> None:
    emit = log.warning if result.corrupt else log.info
    emit(
        event,
        shards=result.shards,
        verified=result.verified,
        skipped=result.skipped,
        corrupt=result.corrupt,
        bytes=result.bytes,
        problems=result.problems or None,
        **extra,
    )


def promotion(
    head: CheckpointHead | None, tier: str, outcome: PromoteOutcome, lag: float | None
) -> None:
    """A rerun of a promotion that changes nothing reports nothing: the lag is observed once."""
    if lag is not None:
        metrics.PROMOTION_LAG.labels(tier).observe(lag)
    if head is None or not outcome.changed:
        return
    with logs.checkpoint_context(job=head.job, step=head.step, tier=tier):
        emit = log.info if outcome.state == TierState.RESTORABLE.value else log.warning
        emit(f"tier {outcome.state}", state=outcome.state, reason=outcome.reason, lag_seconds=lag)
