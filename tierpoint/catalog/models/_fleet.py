"""The machines of the fleet, the policies jobs keep checkpoints by, the jobs and their
timelines' branches."""

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
    func,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from tierpoint.catalog.models._base import Base


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
