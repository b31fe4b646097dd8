"""Health verdicts: the state machine of a checkpoint's training health, and its one writer.

`good` (training went on healthily from it: `latest?health=good` may answer it, retention keeps
a job's newest one), `suspect` (out of `latest?health=good`, nothing else), `bad` (quarantined
with the verdict as its evidence: never restored, never expired as evidence). Bad is final: an
operator who wants the bytes back lifts the quarantine, and the verdict stays as the record.
"""

from __future__ import annotations

import math
from typing import Any

from sqlalchemy import func, update
from sqlalchemy.orm import Session

from tierpoint.catalog.events import EventKind, record
from tierpoint.catalog.holds.quarantine import set_quarantine
from tierpoint.catalog.job.lookup import no_checkpoint, require_job_id
from tierpoint.catalog.locks import ACTION_LOCK, CheckpointAt, lock_in_order
from tierpoint.catalog.models import Checkpoint
from tierpoint.errors import VerdictConflict

GOOD, SUSPECT, BAD = "good", "suspect", "bad"
VERDICTS = (GOOD, SUSPECT, BAD)

# (from, to): the moves a verdict may make; None is "no verdict yet". The same verdict again is
# no move (nothing changes, the first evidence stands).
TRANSITIONS: frozenset[tuple[str | None, str]] = frozenset(
    {
        (None, GOOD),
        (None, SUSPECT),
        (None, BAD),
        (GOOD, SUSPECT),
        (SUSPECT, GOOD),
        (GOOD, BAD),
        (SUSPECT, BAD),
    }
)


def _evidence(
    metric: str | None, value: float | None, at_step: int | None, detail: str | None
) -> dict[str, Any]:
    # JSON has no NaN: a non-finite value is kept as the text JSON readers agree on.
    shown: float | str | None = value
    if value is not None and not math.isfinite(value):
        shown = "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return {"metric": metric, "value": shown, "at_step": at_step, "detail": detail}


def quarantine_reason(evidence: dict[str, Any]) -> str:
    """The quarantine's reason, from the verdict's evidence: `verdict bad: loss=NaN at step 7`."""
    what = []
    if evidence.get("metric") is not None:
        what.append(f"{evidence['metric']}={evidence.get('value')}")
    if evidence.get("at_step") is not None:
        what.append(f"at step {evidence['at_step']}")
    text = "verdict bad" + (": " + " ".join(what) if what else "")
    if evidence.get("detail"):
        text += f" ({evidence['detail']})"
    return text[:1024]


def give_verdict(
    session: Session,
    job: str,
    step: int,
    verdict: str,
    *,
    branch: int | None = None,
    metric: str | None = None,
    value: float | None = None,
    at_step: int | None = None,
    detail: str | None = None,
    actor: str,
) -> bool:
    """Record the verdict on the checkpoint at (job, step[, branch]); `bad` quarantines it with
    the verdict as evidence in the same transaction. Returns whether anything changed; raises
    VerdictConflict for a move the table does not allow."""
    at = CheckpointAt(job, step, branch)
    held = lock_in_order(session, checkpoints=at, checkpoint_lock=ACTION_LOCK).checkpoints
    if not held:
        require_job_id(session, job)
        raise no_checkpoint(job, step, branch)
    (locked,) = held.values()
    # Read past the session's identity map: a row it loaded before the lock may be stale.
    row = session.get_one(Checkpoint, locked.id, populate_existing=True)
    before = row.health
    if before == verdict:
        return False
    # guard: verdict-transitions
    if (before, verdict) not in TRANSITIONS:
        raise VerdictConflict(
            f"step {step} of job {job!r} is marked {before}; it cannot become {verdict} "
            "(bad is final: lift the quarantine to restore from it again)",
            extra={"verdict": before},
        )
    evidence = _evidence(metric, value, at_step, detail)
    session.execute(
        update(Checkpoint)
        .where(Checkpoint.id == locked.id)
        .values(health=verdict, health_evidence=evidence, health_by=actor, health_at=func.now())
        .execution_options(synchronize_session=False)
    )
    record(
        session,
        EventKind.VERDICT,
        checkpoint_id=locked.id,
        job_id=locked.job_id,
        actor=actor,
        detail={"step": step, "verdict": verdict, "previous": before, **evidence},
    )
    if verdict == BAD:
        session.expire(row)
        set_quarantine(
            session,
            job,
            step,
            quarantine_reason(evidence),
            tier=None,
            actor=actor,
            evidence=True,
            branch=branch if branch is not None else row.branch,
        )
    session.flush()
    return True
