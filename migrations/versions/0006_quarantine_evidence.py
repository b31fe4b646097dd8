"""quarantine_evidence: which quarantines keep their copies from retention

A quarantine set by an operator (operate or admin scope) is evidence and retention never expires
it; one reported by a training job (a failed load) only hides the checkpoint from restores. The
quarantines already in the catalog were all kept before this revision: they stay evidence.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 23:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TABLES = ("checkpoint", "checkpoint_tier")


def upgrade() -> None:
    for table in _TABLES:
        op.add_column(
            table,
            sa.Column(
                "quarantine_evidence", sa.Boolean(), server_default=sa.text("false"), nullable=False
            ),
        )
        op.execute(
            f"UPDATE {table} SET quarantine_evidence = true WHERE quarantine_reason IS NOT NULL"
        )


def downgrade() -> None:
    for table in _TABLES:
        op.drop_column(table, "quarantine_evidence")
