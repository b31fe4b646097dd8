"""indexes of the operator views: copies in flight, failures, promotion lag

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01 12:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_checkpoint_tier_pending",
        "checkpoint_tier",
        ["checkpoint_id"],
        unique=False,
        postgresql_where=sa.text("state = 'pending'"),
    )
    op.create_index(
        "ix_checkpoint_tier_failed",
        "checkpoint_tier",
        [sa.text("updated_at DESC")],
        unique=False,
        postgresql_where=sa.text("state = 'failed'"),
    )
    op.create_index(
        "ix_checkpoint_tier_restorable_at",
        "checkpoint_tier",
        ["restorable_at"],
        unique=False,
        postgresql_where=sa.text("restorable_at IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_checkpoint_tier_restorable_at", table_name="checkpoint_tier")
    op.drop_index("ix_checkpoint_tier_failed", table_name="checkpoint_tier")
    op.drop_index("ix_checkpoint_tier_pending", table_name="checkpoint_tier")
