"""peer tier: the address of each node's data endpoint, where peers and restores read its local
and peer tier files

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02 06:10:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("node", sa.Column("data_url", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("node", "data_url")
