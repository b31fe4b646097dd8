"""peer placement: each node's failure domain (rack, zone), as its worker reports it

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02 11:15:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("node", sa.Column("failure_domain", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("node", "failure_domain")
