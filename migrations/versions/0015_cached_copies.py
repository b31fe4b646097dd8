"""cached copies: the files a reader wrote on a node's local tier, which that tier's expiry deletes

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-06 05:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "cached_copy",
        sa.Column("shard_id", sa.BigInteger(), nullable=False),
        sa.Column("tier", sa.String(length=128), nullable=False),
        sa.Column("node_id", sa.String(length=128), nullable=False),
        sa.Column("checkpoint_id", sa.BigInteger(), nullable=False),
        sa.Column(
            "recorded_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["checkpoint_id"],
            ["checkpoint.id"],
            name=op.f("fk_cached_copy_checkpoint_id_checkpoint"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(["node_id"], ["node.id"], name=op.f("fk_cached_copy_node_id_node")),
        sa.ForeignKeyConstraint(
            ["shard_id"],
            ["shard.id"],
            name=op.f("fk_cached_copy_shard_id_shard"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("shard_id", "tier", "node_id", name=op.f("pk_cached_copy")),
    )
    op.create_index(
        "ix_cached_copy_checkpoint_tier",
        "cached_copy",
        ["checkpoint_id", "tier", "node_id"],
        unique=False,
    )


def downgrade() -> None:
    op.drop_index("ix_cached_copy_checkpoint_tier", table_name="cached_copy")
    op.drop_table("cached_copy")
