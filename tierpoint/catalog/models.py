"""The catalog: where every shard of every checkpoint lives, and in what state.

States are stored as text with CHECK constraints rather than native Postgres enums, so adding a
state is a one-line migration.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    Numeric,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    event,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from tierpoint.catalog import usage_rollup
from tierpoint.states import ReplicaState, TierState


class ByteTotal(TypeDecorator[int]):
    """A running total of bytes: NUMERIC in the database (it cannot overflow, whatever it sums),
    an exact int in Python."""

    impl = Numeric
    cache_ok = True

    def process_result_value(self, value: Any, dialect: Dialect) -> int | None:
        return None if value is None else int(value)


NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# The stored text of the two states most queries filter on (columns hold the enum's value).
VERIFIED = ReplicaState.VERIFIED.value
RESTORABLE = TierState.RESTORABLE.value


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {dict[str, Any]: JSONB, datetime: DateTime(timezone=True)}


def _in(column: str, enum: type[StrEnum]) -> str:
    return f"{column} IN ({', '.join(repr(m.value) for m in enum)})"


class Node(Base):
    __tablename__ = "node"

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    # tier name -> root path on this node, as its worker reported them
    local_roots: Mapped[dict[str, Any]] = mapped_column(server_default=text("'{}'::jsonb"))
    last_seen_at: Mapped[datetime | None]
    lost_at: Mapped[datetime | None]
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())
    # Where its worker serves its local and peer tier files (http://host:port); null: not served
    data_url: Mapped[str | None] = mapped_column(Text)
    # What fails together with it (rack, zone), as its worker reported it; null: its own domain
    failure_domain: Mapped[str | None] = mapped_column(Text)


class RetentionPolicy(Base):
    __tablename__ = "retention_policy"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    version: Mapped[int] = mapped_column(Integer, server_default=text("1"))
    spec: Mapped[dict[str, Any]]
    is_default: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(server_default=func.now())

    __table_args__ = (
        # At most one default policy.
        Index(
            "uq_retention_policy_default",
            "is_default",
            unique=True,
            postgresql_where=text("is_default"),
        ),
    )


class Job(Base):
    __tablename__ = "job"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    policy_id: Mapped[int | None] = mapped_column(
        ForeignKey("retention_policy.id", ondelete="RESTRICT")
    )
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())
    # The branch new checkpoints are saved on (`branch.number`); a rollback moves it.
    current_branch: Mapped[int] = mapped_column(Integer, server_default=text("1"))
    # A fork: the checkpoint of another job this one started from (its first restore reads it
    # where it is; retention keeps it until this job has a restorable checkpoint of its own).
    fork_parent_id: Mapped[int | None] = mapped_column(
        ForeignKey("checkpoint.id", ondelete="SET NULL", use_alter=True)
    )
    forked_at: Mapped[datetime | None]
    forked_by: Mapped[str | None] = mapped_column(Text)

    __table_args__ = (
        Index(
            "ix_job_fork_parent",
            "fork_parent_id",
            postgresql_where=text("fork_parent_id IS NOT NULL"),
        ),
    )


class Branch(Base):
    """One branch of a job's timeline: 1 from the start, one more per rollback, which starts it
    from `from_checkpoint_id` (at `from_step`, on branch `parent`)."""

    __tablename__ = "branch"

    job_id: Mapped[int] = mapped_column(ForeignKey("job.id", ondelete="CASCADE"), primary_key=True)
    number: Mapped[int] = mapped_column(Integer, primary_key=True)
    parent: Mapped[int | None] = mapped_column(Integer)
    from_step: Mapped[int | None] = mapped_column(BigInteger)
    from_checkpoint_id: Mapped[int | None] = mapped_column(
        ForeignKey("checkpoint.id", ondelete="SET NULL", use_alter=True)
    )
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())
    created_by: Mapped[str | None] = mapped_column(Text)
    reason: Mapped[str | None] = mapped_column(Text)

    __table_args__ = (CheckConstraint("number >= 1", name="number_positive"),)


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
        CheckConstraint(_in("state", ReplicaState), name="state_valid"),
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
        CheckConstraint(_in("state", TierState), name="state_valid"),
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


class JobTierUsage(Base):
    """Bytes and checkpoints a job holds on a tier (restorable or expiring tier copies): running
    totals kept by the triggers of tierpoint/catalog/usage_rollup.py, never written by the code."""

    __tablename__ = "job_tier_usage"

    job_id: Mapped[int] = mapped_column(ForeignKey("job.id", ondelete="CASCADE"), primary_key=True)
    tier: Mapped[str] = mapped_column(String(128), primary_key=True)
    # Numeric: a sum over any number of checkpoints, each up to 2^53 - 1 bytes, never overflows.
    bytes: Mapped[int] = mapped_column(ByteTotal(), server_default=text("0"))
    checkpoints: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))


@event.listens_for(Base.metadata, "after_create")
def _usage_triggers(target: MetaData, connection: Connection, **_: Any) -> None:
    # After every table: the triggers live on checkpoint_tier and checkpoint.
    for sql in (*usage_rollup.CREATE_FUNCTIONS, *usage_rollup.CREATE_TRIGGERS):
        connection.execute(text(sql))


class RestoreLease(Base):
    __tablename__ = "restore_lease"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    checkpoint_id: Mapped[int] = mapped_column(ForeignKey("checkpoint.id", ondelete="CASCADE"))
    # Who took it (free text, e.g. the restoring job); the column keeps its first name.
    owner: Mapped[str | None] = mapped_column("holder", Text)
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())
    expires_at: Mapped[datetime]
    released_at: Mapped[datetime | None]

    __table_args__ = (Index("ix_restore_lease_checkpoint_expires", "checkpoint_id", "expires_at"),)


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


class AccessToken(Base):
    """A bearer token of the API. Only the sha256 of the secret is stored: the secret has 256 bits
    of entropy, so a slow password hash would add latency to every request and no safety."""

    __tablename__ = "access_token"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    digest: Mapped[str] = mapped_column(String(64), unique=True)
    # e.g. ["train:llama-"], ["read"], ["operate", "read"], ["admin"]
    scopes: Mapped[list[str]] = mapped_column(JSONB)
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())
    expires_at: Mapped[datetime | None]
    revoked_at: Mapped[datetime | None]
    last_used_at: Mapped[datetime | None]


class ScrubStats(Base):
    """Running totals of the scrub per tier, updated in the transaction that records what a scrub
    read, so the API answers "how much was scrubbed, what was found" from one row per tier."""

    __tablename__ = "scrub_stats"

    tier: Mapped[str] = mapped_column(String(128), primary_key=True)
    replicas: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    bytes: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    corrupt: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    lost: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    last_scrubbed_at: Mapped[datetime | None]
    updated_at: Mapped[datetime] = mapped_column(server_default=func.now())


class TierReadStats(Base):
    """Bytes read back from a tier and the seconds it took, summed over the unthrottled reads of
    whole replicas (an operator's verify): the throughput a restore from the tier can expect,
    which the jobs view turns into a predicted restore time."""

    __tablename__ = "tier_read_stats"

    tier: Mapped[str] = mapped_column(String(128), primary_key=True)
    bytes: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    seconds: Mapped[float] = mapped_column(Float, server_default=text("0"))
    updated_at: Mapped[datetime] = mapped_column(server_default=func.now())
