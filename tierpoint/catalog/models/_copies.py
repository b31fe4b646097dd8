"""Where the bytes are: a shard's replicas, the copies readers cached on their nodes, and a
checkpoint's copy on a tier as a whole."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    ForeignKey,
    Index,
    SmallInteger,
    String,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from tierpoint.catalog.models._base import Base, state_check
from tierpoint.states import ReplicaState, TierState


class Replica(Base):
    __tablename__ = "replica"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    shard_id: Mapped[int] = mapped_column(ForeignKey("shard.id", ondelete="CASCADE"))
    # denormalised so that per-checkpoint progress and promotion read one index
    checkpoint_id: Mapped[int] = mapped_column(ForeignKey("checkpoint.id", ondelete="CASCADE"))
    tier: Mapped[str] = mapped_column(String(128))
    node_id: Mapped[str | None] = mapped_column(ForeignKey("node.id"))
    state: Mapped[str] = mapped_column(String(16), server_default=text("'pending'"))
    location: Mapped[str] = mapped_column(Text)
    bytes_done: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    verified_at: Mapped[datetime | None]
    # when a scrub last read these bytes back and found them good; null until the first scrub
    scrubbed_at: Mapped[datetime | None]
    error: Mapped[str | None] = mapped_column(Text)
    updated_at: Mapped[datetime] = mapped_column(server_default=func.now())
    # POSIX copies: which file the catalog last read there (`tierpoint/storage/posix/identity.py`),
    # set by the seal, a copy's read-back and the scrub; a delete removes only that file. Null on
    # S3, and for replicas recorded before migration 0013 until their next scrub.
    file_identity: Mapped[str | None] = mapped_column(Text)

    __table_args__ = (
        UniqueConstraint("shard_id", "tier", name="uq_replica_shard_tier"),
        CheckConstraint(state_check("state", ReplicaState), name="state_valid"),
        Index("ix_replica_checkpoint_tier_state", "checkpoint_id", "tier", "state"),
        Index("ix_replica_node_state", "node_id", "state"),
        # the scrub's queue: per tier, verified replicas whose bytes were read longest ago first
        Index(
            "ix_replica_scrub_due",
            "tier",
            text("coalesce(scrubbed_at, verified_at)"),
            postgresql_where=text("state = 'verified'"),
        ),
    )


class CachedCopy(Base):
    """A copy of a shard that a reader wrote on a node's local tier, beside the node's own files
    of the checkpoint (`<root>/<job>/<step>/<path>`): another node's file the node loaded, kept
    so that the next load there reads it locally. Not a replica (tierpoint never verified it
    there, never serves, scrubs or copies it; the reader verifies it whenever it reads it), but
    a file we know of: expiring the checkpoint's copy on that tier deletes it on that node with
    the node's own files, and the row with it."""

    __tablename__ = "cached_copy"

    shard_id: Mapped[int] = mapped_column(
        ForeignKey("shard.id", ondelete="CASCADE"), primary_key=True
    )
    tier: Mapped[str] = mapped_column(String(128), primary_key=True)
    node_id: Mapped[str] = mapped_column(ForeignKey("node.id"), primary_key=True)
    # denormalised so that an expiry finds a checkpoint's cached copies by one index
    checkpoint_id: Mapped[int] = mapped_column(ForeignKey("checkpoint.id", ondelete="CASCADE"))
    recorded_at: Mapped[datetime] = mapped_column(server_default=func.now())

    __table_args__ = (Index("ix_cached_copy_checkpoint_tier", "checkpoint_id", "tier", "node_id"),)


class TierCopy(Base):
    """A checkpoint's copy on one tier as a whole: restorable only when every shard has a
    verified replica on the tier. Its state changes only in `tier_copy/machine.py`.

    The table keeps its first name, `checkpoint_tier`: renaming it would take a migration (its
    indexes, constraints and the usage triggers are named after it, and a rolling upgrade runs
    old and new code on one schema) and would change nothing a reader of the code meets."""

    __tablename__ = "checkpoint_tier"

    checkpoint_id: Mapped[int] = mapped_column(
        ForeignKey("checkpoint.id", ondelete="CASCADE"), primary_key=True
    )
    tier: Mapped[str] = mapped_column(String(128), primary_key=True)
    # denormalised so that "latest restorable" is one index range scan
    job_id: Mapped[int] = mapped_column(ForeignKey("job.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(BigInteger)
    state: Mapped[str] = mapped_column(String(16), server_default=text("'pending'"))
    reason: Mapped[str | None] = mapped_column(Text)
    quarantine_reason: Mapped[str | None] = mapped_column(Text)
    quarantine_evidence: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    restorable_at: Mapped[datetime | None]
    updated_at: Mapped[datetime] = mapped_column(server_default=func.now())
    # An operator acknowledged the failure: set to the `updated_at` it acknowledged, so any later
    # change of the tier copy (a retry, a new failure) brings it back to the failures view.
    acknowledged_at: Mapped[datetime | None]
    # S3 tiers: the key layout of this checkpoint's objects (`flat`, `spread-N`), recorded when
    # the copy is planned and read by everything that names them; null = flat (copies planned
    # before layouts were recorded). `tierpoint/storage/s3/layout.py`.
    key_layout: Mapped[str | None] = mapped_column(String(32))
    # This copy is being made again (re-replication, repair) from these other tiers' copies of the
    # checkpoint, which retention keeps until `rebuild_until` (`holds/rebuild.py`); the plan of the
    # rebuild records both, its promotion (made or given up) clears them.
    rebuild_from: Mapped[list[str] | None] = mapped_column(JSONB)
    rebuild_until: Mapped[datetime | None]
    # Denormalised from its checkpoint (set by checkpoint/supersede.py with it), so that "latest"
    # skips superseded checkpoints inside one index range instead of after it.
    superseded: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))

    __table_args__ = (
        CheckConstraint(state_check("state", TierState), name="state_valid"),
        Index(
            "ix_checkpoint_tier_latest",
            "job_id",
            "state",
            "tier",
            "superseded",
            text("step DESC"),
        ),
        # The operator views across all jobs: copies in flight (few, however large the catalog),
        # failures newest first, and promotion lag over a recent window.
        Index(
            "ix_checkpoint_tier_pending",
            "checkpoint_id",
            postgresql_where=text("state = 'pending'"),
        ),
        Index(
            "ix_checkpoint_tier_failed",
            text("updated_at DESC"),
            postgresql_where=text("state = 'failed'"),
        ),
        Index(
            "ix_checkpoint_tier_restorable_at",
            "restorable_at",
            postgresql_where=text("restorable_at IS NOT NULL"),
        ),
    )


class Stripe(Base):
    """One erasure-coded stripe of one shard on a coded peer tier: stripe `stripe_index` of the
    shard's file (0..k-1 data, k..k+m-1 parity, tierpoint_client.erasure) held by `node_id`, with
    the size and crc32c the encoder computed, which the holder's read-back must match. Its state
    machine is the replica's states, moved only by tierpoint/catalog/stripe/machine.py."""

    __tablename__ = "stripe"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    shard_id: Mapped[int] = mapped_column(ForeignKey("shard.id", ondelete="CASCADE"))
    # denormalised so that promotion counts a checkpoint's stripes on one index
    checkpoint_id: Mapped[int] = mapped_column(ForeignKey("checkpoint.id", ondelete="CASCADE"))
    tier: Mapped[str] = mapped_column(String(128))
    stripe_index: Mapped[int] = mapped_column(SmallInteger)
    # the code the set was cut with, e.g. rs(4,2): a tier whose code changes keeps old sets
    # readable
    code: Mapped[str] = mapped_column(String(16))
    node_id: Mapped[str] = mapped_column(ForeignKey("node.id"))
    size: Mapped[int] = mapped_column(BigInteger)
    crc32c: Mapped[str] = mapped_column(String(8))
    state: Mapped[str] = mapped_column(String(16), server_default=text("'pending'"))
    verified_at: Mapped[datetime | None]
    # last read back good by its holder's scrub (tierpoint/catalog/stripe/scrub.py)
    scrubbed_at: Mapped[datetime | None]
    error: Mapped[str | None] = mapped_column(Text)
    updated_at: Mapped[datetime] = mapped_column(server_default=func.now())

    __table_args__ = (
        UniqueConstraint("shard_id", "tier", "stripe_index", name="uq_stripe_shard_tier_index"),
        CheckConstraint(state_check("state", ReplicaState), name="state_valid"),
        CheckConstraint("stripe_index >= 0 AND stripe_index < 32", name="index_in_set"),
        CheckConstraint("size >= 0", name="size_nonnegative"),
        Index("ix_stripe_checkpoint_tier_state", "checkpoint_id", "tier", "state"),
        Index("ix_stripe_node_state", "node_id", "state"),
        # the scrub's queue: per tier and holder, verified stripes read longest ago first
        Index(
            "ix_stripe_scrub_due",
            "tier",
            "node_id",
            text("coalesce(scrubbed_at, verified_at)"),
            postgresql_where=text("state = 'verified'"),
        ),
    )
