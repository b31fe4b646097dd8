"""erasure-coded stripes: a coded peer tier's pieces of each shard, one row per stripe

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-06 15:10:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

STATES = "'pending', 'copying', 'verified', 'corrupt', 'lost', 'expiring', 'expired'"


def upgrade() -> None:
    op.create_table(
        "stripe",
        sa.Column("id", sa.BigInteger(), nullable=False),
        sa.Column("shard_id", sa.BigInteger(), nullable=False),
        sa.Column("checkpoint_id", sa.BigInteger(), nullable=False),
        sa.Column("tier", sa.String(length=128), nullable=False),
        sa.Column("stripe_index", sa.SmallInteger(), nullable=False),
        sa.Column("code", sa.String(length=16), nullable=False),
        sa.Column("node_id", sa.String(length=128), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("crc32c", sa.String(length=8), nullable=False),
        sa.Column(
            "state", sa.String(length=16), server_default=sa.text("'pending'"), nullable=False
        ),
        sa.Column("verified_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint(f"state IN ({STATES})", name=op.f("ck_stripe_state_valid")),
        sa.CheckConstraint(
            "stripe_index >= 0 AND stripe_index < 32", name=op.f("ck_stripe_index_in_set")
        ),
        sa.CheckConstraint("size >= 0", name=op.f("ck_stripe_size_nonnegative")),
        sa.ForeignKeyConstraint(
            ["checkpoint_id"],
            ["checkpoint.id"],
            name=op.f("fk_stripe_checkpoint_id_checkpoint"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(["node_id"], ["node.id"], name=op.f("fk_stripe_node_id_node")),
        sa.ForeignKeyConstraint(
            ["shard_id"], ["shard.id"], name=op.f("fk_stripe_shard_id_shard"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_stripe")),
        sa.UniqueConstraint("shard_id", "tier", "stripe_index", name="uq_stripe_shard_tier_index"),
    )
    op.create_index("ix_stripe_checkpoint_tier_state", "stripe", ["checkpoint_id", "tier", "state"])
    op.create_index("ix_stripe_node_state", "stripe", ["node_id", "state"])


def downgrade() -> None:
    op.drop_index("ix_stripe_node_state", table_name="stripe")
    op.drop_index("ix_stripe_checkpoint_tier_state", table_name="stripe")
    op.drop_table("stripe")
