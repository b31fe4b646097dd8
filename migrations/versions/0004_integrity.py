"""running totals of the scrub per tier

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 12:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "scrub_stats",
        sa.Column("tier", sa.String(length=128), nullable=False),
        sa.Column("replicas", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("bytes", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("corrupt", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("lost", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("last_scrubbed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("tier", name=op.f("pk_scrub_stats")),
    )


def downgrade() -> None:
    op.drop_table("scrub_stats")
