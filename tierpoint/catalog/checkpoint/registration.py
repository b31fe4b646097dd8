"""Writing a checkpoint registration into the catalog (invariant 5: idempotent, conflicts refused).

Nothing here commits: the caller commits once, before it answers the client.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, exists, func, select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session

from tierpoint.catalog.checkpoint.placement_on_timeline import branch_to_save_on, parent_of
from tierpoint.catalog.events import EventKind, record
from tierpoint.catalog.job.lookup import job_id_by_name
from tierpoint.catalog.locks import lock_checkpoint
from tierpoint.catalog.models import Branch, Checkpoint, Event, Job, Node, TierCopy
from tierpoint.catalog.tier_copy.machine import REGISTER_TIER_COPIES_SQL, REGISTERED_STATE
from tierpoint.contract.lifecycle import LifecycleInput
from tierpoint.errors import CheckpointBeingDeleted, CheckpointConflict, UnknownNode
from tierpoint.manifest import Manifest
from tierpoint.manifest_digest import manifest_digest, shards_json
from tierpoint.states import TierState

# One statement whatever the shard count: the shards travel as one JSON document that Postgres
# unpacks (cheaper for both sides than an array per column, far cheaper than a row per statement),
# and the tiers' `pending` tier copies go in the same round trip (their half of the statement is
# the tier copy machine's).
_INSERT_SHARDS_AND_TIERS = text(
    "WITH shards AS ("
    "INSERT INTO shard (checkpoint_id, ordinal, path, size, checksum, node_id) "
    "SELECT :cid, x.ordinal - 1, x.path, x.size, x.crc32c, x.node "
    "FROM ROWS FROM (json_to_recordset(CAST(:shards AS json)) "
    "AS (path text, size bigint, crc32c text, node text)) "
    "WITH ORDINALITY AS x(path, size, crc32c, node, ordinal)) " + REGISTER_TIER_COPIES_SQL
)


@dataclass(frozen=True)
class RegistrationResult:
    checkpoint_id: int
    job_id: int
    created: bool
    created_at: datetime
    # Set when a lifecycle workflow is known to have been started for the checkpoint.
    workflow_started: bool
    branch: int = 1
    parent_id: int | None = None


def check_nodes(session: Session, node_ids: Iterable[str]) -> None:
    """Every shard must live on a node whose worker has reported in and that is not lost."""
    wanted = sorted(set(node_ids))
    rows = session.execute(select(Node.id, Node.lost_at).where(Node.id.in_(wanted))).all()
    known = {r.id for r in rows}
    lost = sorted(r.id for r in rows if r.lost_at is not None)
    unknown = [n for n in wanted if n not in known]
    if not unknown and not lost:
        return
    parts = []
    if unknown:
        parts.append(f"unknown nodes: {', '.join(unknown)}")
    if lost:
        parts.append(f"lost nodes: {', '.join(lost)}")
    errors = [
        {
            "field": "shards[].node",
            "location": "body",
            "message": f"node {n!r} is unknown",
            "code": "unknown_node",
        }
        for n in unknown
    ] + [
        {
            "field": "shards[].node",
            "location": "body",
            "message": f"node {n!r} is lost",
            "code": "lost_node",
        }
        for n in lost
    ]
    raise UnknownNode(
        "shards name nodes that cannot hold them ("
        + "; ".join(parts)
        + "): a node is known once its worker has reported in",
        errors=errors,
        extra={"nodes": unknown + lost},
    )


def ensure_job(session: Session, name: str) -> int:
    """The job's id, the job (and its first branch) created when new."""
    found = job_id_by_name(session, name)
    if found is not None:
        return found
    created = session.scalar(
        pg_insert(Job).values(name=name).on_conflict_do_nothing().returning(Job.id)
    )
    if created is not None:
        session.execute(pg_insert(Branch).values(job_id=created, number=1))
        return int(created)
    # A concurrent registration created it and has committed (the insert waited for it).
    again = job_id_by_name(session, name)
    assert again is not None
    return int(again)


def _existing(
    session: Session, job: str, job_id: int, step: int, digest: str
) -> RegistrationResult | int | None:
    """The checkpoint registered at this step (this manifest), the id of one an admin deleted
    there, or None."""
    row = (
        session.execute(
            select(
                Checkpoint.id,
                Checkpoint.manifest_digest,
                Checkpoint.workflow_started_at,
                Checkpoint.created_at,
                Checkpoint.deleted_at,
            ).where(
                Checkpoint.job_id == job_id,
                Checkpoint.step == step,
                Checkpoint.superseded_by.is_(None),
            )
        )
    ).one_or_none()
    if row is None:
        return None
    if row.deleted_at is not None:
        return int(row.id)
    # guard: register-digest
    if row.manifest_digest != digest:
        raise CheckpointConflict(
            f"step {step} of job {job!r} is already registered with a different manifest",
            extra={"registered_digest": row.manifest_digest, "request_digest": digest},
        )
    return RegistrationResult(
        row.id, job_id, False, row.created_at, row.workflow_started_at is not None
    )


def _remove_deleted(session: Session, job: str, step: int, checkpoint_id: int) -> list[int]:
    """An admin deleted the checkpoint at this step: once retention has expired every copy, its
    row goes and the step is registered afresh; returns the ids of its events, which the new
    checkpoint takes over (one history per step: its retries keep counting, so a retry's run id
    is never one the old checkpoint used). While a copy is still being deleted,
    CheckpointBeingDeleted: a new copy must not be written where the old one is being removed."""
    if not lock_checkpoint(session, checkpoint_id):
        return []  # a concurrent registration replaced it and committed
    expiring = session.scalar(
        select(
            exists().where(
                TierCopy.checkpoint_id == checkpoint_id,
                TierCopy.state == TierState.EXPIRING.value,
            )
        )
    )
    # guard: delete-replaces-while-expiring
    if expiring:
        raise CheckpointBeingDeleted(
            f"step {step} of job {job!r} was deleted and its copies are still being removed: "
            "register it again once they are gone"
        )
    history = list(
        session.scalars(
            update(Event)
            .where(Event.checkpoint_id == checkpoint_id)
            .values(checkpoint_id=None)
            .returning(Event.id)
        )
    )
    session.execute(delete(Checkpoint).where(Checkpoint.id == checkpoint_id))
    return history


def register_checkpoint(
    session: Session,
    job: str,
    manifest: Manifest,
    tiers: Sequence[str],
    *,
    actor: str = "api",
) -> RegistrationResult:
    """Insert job (if new), checkpoint, shards, one `pending` tier copy per tier and the
    `registered` event; or return the existing checkpoint when the same manifest is registered
    again. Raises CheckpointConflict for a different manifest at the same step and UnknownNode
    for shards on unknown or lost nodes. The caller has validated `job` and the manifest."""
    digest = manifest_digest(manifest.shards)
    check_nodes(session, {s.node for s in manifest.shards})

    job_id = ensure_job(session, job)
    branch = branch_to_save_on(session, job, job_id, manifest.branch)
    existing = _existing(session, job, job_id, manifest.step, digest)
    if isinstance(existing, RegistrationResult):
        return existing
    parent_id = parent_of(session, job, job_id, manifest)
    history = [] if existing is None else _remove_deleted(session, job, manifest.step, existing)

    inserted = (
        session.execute(
            pg_insert(Checkpoint)
            .values(
                job_id=job_id,
                step=manifest.step,
                meta=manifest.metadata,
                total_bytes=manifest.total_bytes,
                shard_count=len(manifest.shards),
                manifest_digest=digest,
                branch=branch,
                parent_id=parent_id,
                provenance=(
                    None
                    if manifest.provenance is None
                    else manifest.provenance.model_dump(exclude_none=True)
                ),
            )
            .on_conflict_do_nothing(
                index_elements=["job_id", "step"], index_where=text("superseded_by IS NULL")
            )
            .returning(Checkpoint.id, Checkpoint.created_at)
        )
    ).one_or_none()
    if inserted is None:
        # Lost the race against a concurrent registration of the same step, which has committed.
        raced = _existing(session, job, job_id, manifest.step, digest)
        assert isinstance(raced, RegistrationResult)
        return raced
    checkpoint_id, created_at = inserted.id, inserted.created_at
    if history:
        session.execute(
            update(Event).where(Event.id.in_(history)).values(checkpoint_id=checkpoint_id)
        )

    session.execute(
        _INSERT_SHARDS_AND_TIERS,
        {
            "cid": checkpoint_id,
            "shards": shards_json(manifest.shards).decode(),
            "job_id": job_id,
            "step": manifest.step,
            "state": REGISTERED_STATE,
            "tiers": list(tiers),
        },
    )
    record(
        session,
        EventKind.REGISTERED,
        checkpoint_id=checkpoint_id,
        job_id=job_id,
        actor=actor,
        detail={
            "step": manifest.step,
            "shards": len(manifest.shards),
            "bytes": manifest.total_bytes,
            "digest": digest,
        },
    )
    return RegistrationResult(checkpoint_id, job_id, True, created_at, False, branch, parent_id)


def mark_workflow_started(session: Session, checkpoint_id: int) -> bool:
    """Record that the lifecycle workflow runs; first writer wins (the API or the reconciler)."""
    result = session.execute(
        update(Checkpoint)
        .where(Checkpoint.id == checkpoint_id, Checkpoint.workflow_started_at.is_(None))
        .values(workflow_started_at=func.now())
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


def unstarted_checkpoints(
    session: Session, older_than: timedelta, limit: int
) -> list[LifecycleInput]:
    """Registered checkpoints whose lifecycle nobody has started, oldest first (reads the partial
    index `ix_checkpoint_unstarted`)."""
    rows = session.execute(
        select(Checkpoint.id, Job.name, Checkpoint.step, Checkpoint.created_at, Checkpoint.branch)
        .join(Job, Job.id == Checkpoint.job_id)
        .where(
            Checkpoint.workflow_started_at.is_(None),
            Checkpoint.created_at < func.now() - older_than,
        )
        .order_by(Checkpoint.created_at)
        .limit(limit)
    )
    return [
        LifecycleInput(checkpoint_id=i, job=j, step=s, registered_at=at, branch=b)
        for i, j, s, at, b in rows
    ]
