"""operators: a failed copy acknowledged, a checkpoint deleted by an admin, the read throughput
seen per tier

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 23:20:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "checkpoint_tier",
        sa.Column("acknowledged_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.add_column("checkpoint", sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True))
    op.create_table(
        "tier_read_stats",
        sa.Column("tier", sa.String(length=128), nullable=False),
        sa.Column("bytes", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("seconds", sa.Float(), server_default=sa.text("0"), nullable=False),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("tier", name=op.f("pk_tier_read_stats")),
    )


def downgrade() -> None:
    op.drop_table("tier_read_stats")
    op.drop_column("checkpoint", "deleted_at")
    op.drop_column("checkpoint_tier", "acknowledged_at")
