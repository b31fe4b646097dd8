"""What the lifecycle activities report besides the catalog (activities/observe.py), with no
service at all: a promotion's lag is observed once, a promotion that changed something is one log
line in the checkpoint's context (a warning unless the tier became restorable), a rerun that
changed nothing is silent, and a batch with corrupt shards is a warning."""

from __future__ import annotations

import uuid

import structlog
from prometheus_client import REGISTRY

from activities import observe
from tierpoint.catalog.job.lookup import CheckpointHead
from tierpoint.catalog.tier_copy.promotion import PromoteOutcome
from tierpoint.contract.lifecycle import BatchResult

LAG = "tierpoint_worker_promotion_lag_seconds"


def _lags(tier: str) -> float:
    return REGISTRY.get_sample_value(f"{LAG}_count", {"tier": tier}) or 0.0


def test_a_promotion_is_observed_once_and_logged_only_when_it_changed_something() -> None:
    tier = f"tier-{uuid.uuid4().hex[:8]}"
    head = CheckpointHead(id=1, job_id=1, job="llama", step=7, shard_count=1, total_bytes=10)
    with structlog.testing.capture_logs([structlog.contextvars.merge_contextvars]) as logged:
        observe.promotion(head, tier, PromoteOutcome("restorable", None, changed=True), 12.0)
        observe.promotion(head, tier, PromoteOutcome("restorable", None, changed=False), None)
        observe.promotion(head, tier, PromoteOutcome("failed", "1 of 1 missing", True), None)
        observe.promotion(None, tier, PromoteOutcome("failed", "gone", changed=True), None)
    assert _lags(tier) == 1.0
    assert [(e["event"], e["log_level"], e.get("reason")) for e in logged] == [
        ("tier restorable", "info", None),
        ("tier failed", "warning", "1 of 1 missing"),
    ]
    assert all((e["job"], e["step"], e["tier"]) == ("llama", 7, tier) for e in logged)


def test_a_batch_with_corrupt_shards_is_a_warning() -> None:
    good = BatchResult(shards=2, verified=2)
    bad = BatchResult(shards=2, verified=1, corrupt=1, problems=["a.bin: crc32c"])
    with structlog.testing.capture_logs() as logged:
        observe.batch("batch sealed", good, tier="ssd")
        observe.batch("batch sealed", bad, tier="ssd")
    assert [(e["log_level"], e["corrupt"], e["problems"]) for e in logged] == [
        ("info", 0, None),
        ("warning", 1, ["a.bin: crc32c"]),
    ]
