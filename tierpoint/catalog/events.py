"""The append-only event history. Every writer records through `record`: the activities on their
sync sessions, the API with `await session.run_sync(record, ...)` on its async ones."""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Any

from sqlalchemy import insert
from sqlalchemy.orm import Session

from tierpoint.catalog.models import Event


class EventKind(StrEnum):
    REGISTERED = "registered"
    SEALED = "sealed"
    COPIED = "copied"
    VERIFIED = "verified"
    PROMOTED = "promoted"
    CORRUPT = "corrupt"
    FAILED = "failed"
    EXPIRING = "expiring"
    EXPIRED = "expired"
    QUARANTINED = "quarantined"
    QUARANTINE_LIFTED = "quarantine_lifted"
    PINNED = "pinned"
    UNPINNED = "unpinned"
    LEASED = "leased"
    POLICY_CHANGED = "policy_changed"
    OPERATOR_ACTION = "operator_action"
    NODE_LOST = "node_lost"
    LOST = "lost"
    REPAIRED = "repaired"
    CORRUPT_REPORTED = "corrupt_reported"
    DELETED = "deleted"
    # A delete kept a file at a shard's path that is not the one the catalog verified there.
    KEPT = "kept"
    ACKNOWLEDGED = "acknowledged"
    # A run's timeline: a rollback (on its target), each checkpoint it superseded, a verdict, a
    # fork (on the parent checkpoint).
    ROLLED_BACK = "rolled_back"
    SUPERSEDED = "superseded"
    VERDICT = "verdict"
    FORKED = "forked"


def _row(
    kind: EventKind,
    checkpoint_id: int | None,
    job_id: int | None,
    tier: str | None,
    actor: str | None,
    detail: dict[str, Any] | None,
) -> dict[str, Any]:
    return {
        "kind": kind.value,
        "checkpoint_id": checkpoint_id,
        "job_id": job_id,
        "tier": tier,
        "actor": actor,
        "detail": detail or {},
    }


def record(
    session: Session,
    kind: EventKind,
    *,
    checkpoint_id: int | None = None,
    job_id: int | None = None,
    tier: str | None = None,
    actor: str | None = None,
    detail: dict[str, Any] | None = None,
) -> None:
    session.execute(insert(Event).values(_row(kind, checkpoint_id, job_id, tier, actor, detail)))


def record_together(
    session: Session,
    events: Sequence[tuple[EventKind, dict[str, Any]]],
    *,
    checkpoint_id: int | None,
    job_id: int | None,
    tier: str | None,
    actor: str | None,
) -> None:
    """Several events of one checkpoint's tier (kind, detail) in one statement, in order: a batch
    activity's outcome, where a storm of tiny checkpoints pays per round trip."""
    if events:
        rows = [_row(kind, checkpoint_id, job_id, tier, actor, detail) for kind, detail in events]
        session.execute(insert(Event).values(rows))
