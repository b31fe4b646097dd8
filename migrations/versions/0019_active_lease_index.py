"""active restore leases indexed apart: retention's and deletion's lease checks read no released
lease, and a checkpoint's leases list in id order

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-06 18:40:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A restart storm leaves thousands of released leases on one checkpoint, each until its
    # expiry; the old (checkpoint_id, expires_at) index made every active-lease check visit them.
    op.create_index(
        "ix_restore_lease_active",
        "restore_lease",
        ["checkpoint_id", "expires_at"],
        unique=False,
        postgresql_where=sa.text("released_at IS NULL"),
    )
    op.create_index(
        "ix_restore_lease_checkpoint_id", "restore_lease", ["checkpoint_id", "id"], unique=False
    )
    op.drop_index("ix_restore_lease_checkpoint_expires", table_name="restore_lease")


def downgrade() -> None:
    op.create_index(
        "ix_restore_lease_checkpoint_expires",
        "restore_lease",
        ["checkpoint_id", "expires_at"],
        unique=False,
    )
    op.drop_index("ix_restore_lease_checkpoint_id", table_name="restore_lease")
    op.drop_index("ix_restore_lease_active", table_name="restore_lease")
