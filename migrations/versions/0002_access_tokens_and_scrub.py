"""access tokens and the scrub's last-read time per replica

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01 11:50:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "access_token",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("scopes", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_access_token")),
        sa.UniqueConstraint("digest", name=op.f("uq_access_token_digest")),
        sa.UniqueConstraint("name", name=op.f("uq_access_token_name")),
    )
    op.add_column("replica", sa.Column("scrubbed_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index(
        "ix_replica_scrub_due",
        "replica",
        ["tier", sa.text("coalesce(scrubbed_at, verified_at)")],
        unique=False,
        postgresql_where=sa.text("state = 'verified'"),
    )


def downgrade() -> None:
    op.drop_index(
        "ix_replica_scrub_due", table_name="replica", postgresql_where=sa.text("state = 'verified'")
    )
    op.drop_column("replica", "scrubbed_at")
    op.drop_table("access_token")
