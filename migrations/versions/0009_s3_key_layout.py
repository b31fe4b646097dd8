"""S3 key layouts: the layout of each checkpoint's S3 objects, recorded when its copy is planned

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02 11:10:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable, no default, no rewrite of the table: every existing copy is flat, which is what
    # null means.
    op.add_column("checkpoint_tier", sa.Column("key_layout", sa.String(32), nullable=True))


def downgrade() -> None:
    # Without the column every copy would be read as flat: refuse while a spread one exists.
    spread = op.get_bind().execute(
        sa.text("SELECT count(*) FROM checkpoint_tier WHERE key_layout LIKE 'spread-%'")
    )
    if spread.scalar_one():
        raise RuntimeError(
            "checkpoint copies with a spread S3 key layout exist: expire them before downgrading"
        )
    op.drop_column("checkpoint_tier", "key_layout")
