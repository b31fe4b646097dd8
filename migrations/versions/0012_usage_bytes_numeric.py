"""job_tier_usage.bytes: numeric, so that a job's running total over any number of checkpoints
never overflows (a checkpoint's own total stays BIGINT: registration bounds it to 2^53 - 1)

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-06 05:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.alter_column(
        "job_tier_usage",
        "bytes",
        type_=sa.Numeric(),
        existing_type=sa.BigInteger(),
        existing_nullable=False,
        existing_server_default=sa.text("0"),
    )


def downgrade() -> None:
    # Fails, changing nothing, while a job holds more than 2^63 - 1 bytes on a tier.
    op.alter_column(
        "job_tier_usage",
        "bytes",
        type_=sa.BigInteger(),
        existing_type=sa.Numeric(),
        existing_nullable=False,
        existing_server_default=sa.text("0"),
        postgresql_using="bytes::bigint",
    )
