"""the scrub per stripe: when a holder last read each stripe back good, and the stripes counted
in the scrub's totals

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-06 18:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("stripe", sa.Column("scrubbed_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index(
        "ix_stripe_scrub_due",
        "stripe",
        ["tier", "node_id", sa.text("coalesce(scrubbed_at, verified_at)")],
        postgresql_where=sa.text("state = 'verified'"),
    )
    op.add_column(
        "scrub_stats",
        sa.Column("stripes", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
    )


def downgrade() -> None:
    op.drop_column("scrub_stats", "stripes")
    op.drop_index("ix_stripe_scrub_due", table_name="stripe")
    op.drop_column("stripe", "scrubbed_at")
