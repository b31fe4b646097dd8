"""retention: the tiers a copy being made again (re-replication, repair) reads from, until when

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02 19:40:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "checkpoint_tier",
        sa.Column("rebuild_from", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    )
    op.add_column(
        "checkpoint_tier", sa.Column("rebuild_until", sa.DateTime(timezone=True), nullable=True)
    )


def downgrade() -> None:
    op.drop_column("checkpoint_tier", "rebuild_until")
    op.drop_column("checkpoint_tier", "rebuild_from")
