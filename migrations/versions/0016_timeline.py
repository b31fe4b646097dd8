"""a run's timeline: branches, superseded checkpoints, forks, lineage and health verdicts

Every existing job gets branch 1 and every existing checkpoint is on it, on the timeline (not
superseded), with no parent, provenance or verdict: a job that never rolls back reads as before.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-06 08:10:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _branch_table() -> None:
    op.create_table(
        "branch",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("parent", sa.Integer(), nullable=True),
        sa.Column("from_step", sa.BigInteger(), nullable=True),
        sa.Column("from_checkpoint_id", sa.BigInteger(), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("created_by", sa.Text(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.CheckConstraint("number >= 1", name=op.f("ck_branch_number_positive")),
        sa.ForeignKeyConstraint(
            ["job_id"], ["job.id"], name=op.f("fk_branch_job_id_job"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["from_checkpoint_id"],
            ["checkpoint.id"],
            name=op.f("fk_branch_from_checkpoint_id_checkpoint"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("job_id", "number", name=op.f("pk_branch")),
    )
    # Existing jobs: their one branch, dated from the job.
    op.execute("INSERT INTO branch (job_id, number, created_at) SELECT id, 1, created_at FROM job")


def _job_columns() -> None:
    op.add_column(
        "job",
        sa.Column("current_branch", sa.Integer(), server_default=sa.text("1"), nullable=False),
    )
    op.add_column("job", sa.Column("fork_parent_id", sa.BigInteger(), nullable=True))
    op.add_column("job", sa.Column("forked_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("job", sa.Column("forked_by", sa.Text(), nullable=True))
    op.create_foreign_key(
        op.f("fk_job_fork_parent_id_checkpoint"),
        "job",
        "checkpoint",
        ["fork_parent_id"],
        ["id"],
        ondelete="SET NULL",
    )
    op.create_index(
        "ix_job_fork_parent",
        "job",
        ["fork_parent_id"],
        postgresql_where=sa.text("fork_parent_id IS NOT NULL"),
    )


def _checkpoint_columns() -> None:
    op.add_column(
        "checkpoint", sa.Column("branch", sa.Integer(), server_default=sa.text("1"), nullable=False)
    )
    op.add_column("checkpoint", sa.Column("superseded_by", sa.Integer(), nullable=True))
    op.add_column("checkpoint", sa.Column("parent_id", sa.BigInteger(), nullable=True))
    op.add_column(
        "checkpoint",
        sa.Column("provenance", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    )
    op.add_column("checkpoint", sa.Column("health", sa.String(length=16), nullable=True))
    op.add_column(
        "checkpoint",
        sa.Column("health_evidence", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    )
    op.add_column("checkpoint", sa.Column("health_by", sa.Text(), nullable=True))
    op.add_column("checkpoint", sa.Column("health_at", sa.DateTime(timezone=True), nullable=True))
    op.create_foreign_key(
        op.f("fk_checkpoint_parent_id_checkpoint"),
        "checkpoint",
        "checkpoint",
        ["parent_id"],
        ["id"],
        ondelete="SET NULL",
    )
    op.create_check_constraint(
        op.f("ck_checkpoint_health_valid"), "checkpoint", "health IN ('good', 'suspect', 'bad')"
    )
    op.create_check_constraint(op.f("ck_checkpoint_branch_positive"), "checkpoint", "branch >= 1")
    # A step is unique within a branch, and on the timeline (the partial index).
    op.drop_constraint("uq_checkpoint_job_step", "checkpoint", type_="unique")
    op.create_unique_constraint(
        "uq_checkpoint_job_branch_step", "checkpoint", ["job_id", "branch", "step"]
    )
    op.create_index(
        "uq_checkpoint_timeline_step",
        "checkpoint",
        ["job_id", "step"],
        unique=True,
        postgresql_where=sa.text("superseded_by IS NULL"),
    )
    op.create_index(
        "ix_checkpoint_good",
        "checkpoint",
        ["job_id", sa.text("step DESC")],
        postgresql_where=sa.text("health = 'good' AND superseded_by IS NULL"),
    )
    op.create_index(
        "ix_checkpoint_parent",
        "checkpoint",
        ["parent_id"],
        postgresql_where=sa.text("parent_id IS NOT NULL"),
    )


def _tier_copy_columns() -> None:
    op.add_column(
        "checkpoint_tier",
        sa.Column("superseded", sa.Boolean(), server_default=sa.text("false"), nullable=False),
    )
    op.drop_index("ix_checkpoint_tier_latest", table_name="checkpoint_tier")
    op.create_index(
        "ix_checkpoint_tier_latest",
        "checkpoint_tier",
        ["job_id", "state", "tier", "superseded", sa.text("step DESC")],
    )


def upgrade() -> None:
    _branch_table()
    _job_columns()
    _checkpoint_columns()
    _tier_copy_columns()


def _refuse_a_timeline() -> None:
    """Only a catalog that never rolled back goes back, checked before anything changes: two
    checkpoints of one step would break the old unique constraint (and which is which would be
    lost), and a checkpoint saved on a later branch has its files under `<step>.b<N>`, which the
    earlier version cannot name. Nothing is deleted to make the downgrade pass."""
    shared, later = (
        op.get_bind()
        .execute(
            sa.text(
                "SELECT count(*) FILTER (WHERE n > 1), count(*) FILTER (WHERE branch > 1) FROM "
                "(SELECT branch, count(*) OVER (PARTITION BY job_id, step) AS n FROM checkpoint) c"
            )
        )
        .one()
    )
    # guard: downgrade-refuses-a-timeline
    if later:
        raise RuntimeError(
            f"cannot downgrade below 0016: this catalog has rolled back. {shared} checkpoint(s) "
            f"share a step with another checkpoint of their job, and {later} checkpoint(s) were "
            "saved on a branch after the first (their files are under <step>.b<N> directories, "
            "which the earlier version cannot name). Nothing was changed. Stay on this version, "
            "or restore the catalog from a backup taken before the upgrade to 0016"
        )


def downgrade() -> None:
    _refuse_a_timeline()
    op.drop_index("ix_checkpoint_tier_latest", table_name="checkpoint_tier")
    op.create_index(
        "ix_checkpoint_tier_latest",
        "checkpoint_tier",
        ["job_id", "state", "tier", sa.text("step DESC")],
    )
    op.drop_column("checkpoint_tier", "superseded")
    op.drop_index("ix_checkpoint_parent", table_name="checkpoint")
    op.drop_index("ix_checkpoint_good", table_name="checkpoint")
    op.drop_index("uq_checkpoint_timeline_step", table_name="checkpoint")
    op.drop_constraint("uq_checkpoint_job_branch_step", "checkpoint", type_="unique")
    op.create_unique_constraint("uq_checkpoint_job_step", "checkpoint", ["job_id", "step"])
    op.drop_constraint(op.f("ck_checkpoint_branch_positive"), "checkpoint", type_="check")
    op.drop_constraint(op.f("ck_checkpoint_health_valid"), "checkpoint", type_="check")
    op.drop_constraint(op.f("fk_checkpoint_parent_id_checkpoint"), "checkpoint", type_="foreignkey")
    for column in (
        "health_at",
        "health_by",
        "health_evidence",
        "health",
        "provenance",
        "parent_id",
        "superseded_by",
        "branch",
    ):
        op.drop_column("checkpoint", column)
    op.drop_index("ix_job_fork_parent", table_name="job")
    op.drop_constraint(op.f("fk_job_fork_parent_id_checkpoint"), "job", type_="foreignkey")
    for column in ("forked_by", "forked_at", "fork_parent_id", "current_branch"):
        op.drop_column("job", column)
    op.drop_table("branch")
