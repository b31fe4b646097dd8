"""A checkpoint, its shards, the restore leases that hold it and its history."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column, relationship

from tierpoint.catalog.models._base import Base
from tierpoint.catalog.models._fleet import Job


class Checkpoint(Base):
    __tablename__ = "checkpoint"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("job.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", server_default=text("'{}'::jsonb"))
    pinned: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    quarantine_reason: Mapped[str | None] = mapped_column(Text)
    # The quarantine is an operator's evidence, which retention never expires (a training job's
    # only hides the checkpoint from restores). False when not quarantined.
    quarantine_evidence: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    total_bytes: Mapped[int] = mapped_column(BigInteger)
    shard_count: Mapped[int] = mapped_column(Integer)
    # sha256 of the canonical manifest: the same (job, step, manifest) registers once (invariant 5)
    manifest_digest: Mapped[str] = mapped_column(String(64))
    workflow_started_at: Mapped[datetime | None]
    # An admin deleted it: its copies go through retention's expiry, "latest" never offers it,
    # and the step may be registered again once every copy is expired.
    deleted_at: Mapped[datetime | None]
    # The branch it was saved on; a step is unique within a branch, and on the timeline (the
    # checkpoints no rollback superseded).
    branch: Mapped[int] = mapped_column(Integer, server_default=text("1"))
    # The branch whose rollback superseded it: still listed and restorable by branch, never
    # "latest", expired first. Null: on the job's timeline. Set only by checkpoint/supersede.py.
    superseded_by: Mapped[int | None] = mapped_column(Integer)
    # The checkpoint the run had loaded before writing this one (across branches and jobs).
    parent_id: Mapped[int | None] = mapped_column(ForeignKey("checkpoint.id", ondelete="SET NULL"))
    provenance: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    # Its health verdict (timeline/verdicts.py, the one writer): good | suspect | bad, with the
    # evidence ({metric, value, at_step, detail}), who gave it and when.
    health: Mapped[str | None] = mapped_column(String(16))
    health_evidence: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    health_by: Mapped[str | None] = mapped_column(Text)
    health_at: Mapped[datetime | None]

    job: Mapped[Job] = relationship(lazy="raise", foreign_keys=[job_id])

    __table_args__ = (
        UniqueConstraint("job_id", "branch", "step", name="uq_checkpoint_job_branch_step"),
        # On the timeline a step is one checkpoint: registration's idempotence and conflicts
        # hold against it, and "latest" never sees two of one step.
        Index(
            "uq_checkpoint_timeline_step",
            "job_id",
            "step",
            unique=True,
            postgresql_where=text("superseded_by IS NULL"),
        ),
        # latest?health=good: the newest good checkpoints of the timeline, one index range.
        Index(
            "ix_checkpoint_good",
            "job_id",
            text("step DESC"),
            postgresql_where=text("health = 'good' AND superseded_by IS NULL"),
        ),
        Index("ix_checkpoint_parent", "parent_id", postgresql_where=text("parent_id IS NOT NULL")),
        CheckConstraint("health IN ('good', 'suspect', 'bad')", name="health_valid"),
        CheckConstraint("branch >= 1", name="branch_positive"),
        CheckConstraint("step >= 0", name="step_nonnegative"),
        Index(
            "ix_checkpoint_unstarted",
            "created_at",
            postgresql_where=text("workflow_started_at IS NULL"),
        ),
    )


class Shard(Base):
    __tablename__ = "shard"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    checkpoint_id: Mapped[int] = mapped_column(ForeignKey("checkpoint.id", ondelete="CASCADE"))
    # position in the manifest; batches are ranges of it
    ordinal: Mapped[int] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(Text)
    size: Mapped[int] = mapped_column(BigInteger)
    checksum_algorithm: Mapped[str] = mapped_column(String(16), server_default=text("'crc32c'"))
    # null until the seal stage computes it, when the job did not send one
    checksum: Mapped[str | None] = mapped_column(String(64))
    # No foreign key to node, and no unique index on (checkpoint_id, ordinal): registration is
    # the training job's hot path and each costs a per-row check on 1,000s of inserted rows.
    # Registration checks the nodes and numbers the ordinals itself, in the same transaction.
    node_id: Mapped[str] = mapped_column(String(128))

    __table_args__ = (
        UniqueConstraint("checkpoint_id", "path", name="uq_shard_checkpoint_path"),
        CheckConstraint("size >= 0", name="size_nonnegative"),
        Index("ix_shard_checkpoint_node_ordinal", "checkpoint_id", "node_id", "ordinal"),
    )


class RestoreLease(Base):
    __tablename__ = "restore_lease"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    checkpoint_id: Mapped[int] = mapped_column(ForeignKey("checkpoint.id", ondelete="CASCADE"))
    # Who took it (free text, e.g. the restoring job); the column keeps its first name.
    owner: Mapped[str | None] = mapped_column("holder", Text)
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())
    expires_at: Mapped[datetime]
    released_at: Mapped[datetime | None]

    __table_args__ = (
        # Active leases only: what retention and deletion check, however many were released.
        Index(
            "ix_restore_lease_active",
            "checkpoint_id",
            "expires_at",
            postgresql_where=text("released_at IS NULL"),
        ),
        # A checkpoint's leases in id order (the listing's pages).
        Index("ix_restore_lease_checkpoint_id", "checkpoint_id", "id"),
    )


class Event(Base):
    """Append-only history per checkpoint (and per job, for policy changes)."""

    __tablename__ = "event"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    job_id: Mapped[int | None] = mapped_column(ForeignKey("job.id", ondelete="CASCADE"))
    checkpoint_id: Mapped[int | None] = mapped_column(
        ForeignKey("checkpoint.id", ondelete="CASCADE")
    )
    kind: Mapped[str] = mapped_column(String(32))
    tier: Mapped[str | None] = mapped_column(String(128))
    actor: Mapped[str | None] = mapped_column(String(128))
    detail: Mapped[dict[str, Any]] = mapped_column(server_default=text("'{}'::jsonb"))
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())

    __table_args__ = (
        Index("ix_event_checkpoint_id", "checkpoint_id", "id"),
        Index("ix_event_job_id", "job_id", "id"),
    )
