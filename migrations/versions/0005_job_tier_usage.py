"""job_tier_usage: running totals of what each job holds on each tier, kept by triggers

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 13:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_HELD = "('restorable', 'expiring')"

# A copy of tierpoint/catalog/usage_rollup.py as of this revision: a migration does not change
# when the code does (the schema drift test compares the two).
_FUNCTIONS = (
    f"""CREATE FUNCTION job_tier_usage_marker() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND (OLD.state IN {_HELD}) = (NEW.state IN {_HELD}) THEN
        RETURN NULL;
    END IF;
    IF TG_OP <> 'INSERT' AND OLD.state IN {_HELD} THEN
        UPDATE job_tier_usage u
        SET bytes = u.bytes - c.total_bytes, checkpoints = u.checkpoints - 1
        FROM checkpoint c
        WHERE c.id = OLD.checkpoint_id AND u.job_id = OLD.job_id AND u.tier = OLD.tier
          AND EXISTS (SELECT 1 FROM job j WHERE j.id = OLD.job_id);
    END IF;
    IF TG_OP <> 'DELETE' AND NEW.state IN {_HELD} THEN
        INSERT INTO job_tier_usage (job_id, tier, bytes, checkpoints)
        SELECT NEW.job_id, NEW.tier, c.total_bytes, 1 FROM checkpoint c
        WHERE c.id = NEW.checkpoint_id
        ON CONFLICT (job_id, tier) DO UPDATE
        SET bytes = job_tier_usage.bytes + EXCLUDED.bytes,
            checkpoints = job_tier_usage.checkpoints + 1;
    END IF;
    RETURN NULL;
END
$$""",
    f"""CREATE FUNCTION job_tier_usage_checkpoint() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE job_tier_usage u
    SET bytes = u.bytes - OLD.total_bytes, checkpoints = u.checkpoints - 1
    FROM checkpoint_tier ct
    WHERE ct.checkpoint_id = OLD.id AND ct.state IN {_HELD}
      AND u.job_id = ct.job_id AND u.tier = ct.tier
      AND EXISTS (SELECT 1 FROM job j WHERE j.id = OLD.job_id);
    RETURN OLD;
END
$$""",
)
_TRIGGERS = (
    "CREATE TRIGGER job_tier_usage_marker AFTER INSERT OR DELETE OR UPDATE OF state "
    "ON checkpoint_tier FOR EACH ROW EXECUTE FUNCTION job_tier_usage_marker()",
    "CREATE TRIGGER job_tier_usage_checkpoint BEFORE DELETE "
    "ON checkpoint FOR EACH ROW EXECUTE FUNCTION job_tier_usage_checkpoint()",
)


def upgrade() -> None:
    op.create_table(
        "job_tier_usage",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("tier", sa.String(length=128), nullable=False),
        sa.Column("bytes", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("checkpoints", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["job.id"],
            name=op.f("fk_job_tier_usage_job_id_job"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("job_id", "tier", name=op.f("pk_job_tier_usage")),
    )
    # Totals first, under a lock that keeps markers still until the triggers count them.
    op.execute("LOCK TABLE checkpoint_tier IN SHARE ROW EXCLUSIVE MODE")
    op.execute(
        f"""INSERT INTO job_tier_usage (job_id, tier, bytes, checkpoints)
SELECT ct.job_id, ct.tier, sum(c.total_bytes), count(*)
FROM checkpoint_tier ct JOIN checkpoint c ON c.id = ct.checkpoint_id
WHERE ct.state IN {_HELD}
GROUP BY ct.job_id, ct.tier"""
    )
    for sql in (*_FUNCTIONS, *_TRIGGERS):
        op.execute(sql)


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS job_tier_usage_checkpoint ON checkpoint")
    op.execute("DROP TRIGGER IF EXISTS job_tier_usage_marker ON checkpoint_tier")
    op.execute("DROP FUNCTION IF EXISTS job_tier_usage_checkpoint()")
    op.execute("DROP FUNCTION IF EXISTS job_tier_usage_marker()")
    op.drop_table("job_tier_usage")
