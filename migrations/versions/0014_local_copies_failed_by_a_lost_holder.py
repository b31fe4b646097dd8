"""nodes: local copies that a lost node failed though it held only peer copies of them are
restorable again

Declaring a node lost used to fail the local-tier copy of every checkpoint with any replica on
the node, the peer copies it held for other nodes included. Such a copy lost no byte: every
shard is still verified on its own, live node. It stayed `failed`, hidden from restores, and
retention never expired it. This revision makes each one restorable again, as promotion would
(every shard verified on the tier, none on a lost node), with a `promoted` event that says why.
A copy that really lost bytes (a replica on a lost node, a shard not verified) stays failed.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-06 09:00:00.000000
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# tierpoint/catalog/node/registry.py: lost_reason(node), the reason every such marker was given.
LOST_REASON = "^node .+ was declared lost: its local copies are gone$"
WHY = (
    "a lost node held only peer copies of this checkpoint: this copy lost no byte (migration 0014)"
)


def upgrade() -> None:
    # The usage totals follow the markers through their triggers (revision 0005).
    op.execute(
        f"""
        WITH healed AS (
            UPDATE checkpoint_tier ct
            SET state = 'restorable', reason = NULL, updated_at = now(),
                restorable_at = coalesce(ct.restorable_at, now())
            WHERE ct.state = 'failed'
              AND ct.reason ~ '{LOST_REASON}'
              AND NOT EXISTS (
                  SELECT 1 FROM replica r JOIN node n ON n.id = r.node_id
                  WHERE r.checkpoint_id = ct.checkpoint_id AND r.tier = ct.tier
                    AND n.lost_at IS NOT NULL)
              AND EXISTS (SELECT 1 FROM shard s WHERE s.checkpoint_id = ct.checkpoint_id)
              AND NOT EXISTS (
                  SELECT 1 FROM shard s
                  WHERE s.checkpoint_id = ct.checkpoint_id
                    AND NOT EXISTS (
                        SELECT 1 FROM replica r
                        WHERE r.shard_id = s.id AND r.tier = ct.tier
                          AND r.state = 'verified'))
            RETURNING ct.checkpoint_id, ct.job_id, ct.tier
        )
        INSERT INTO event (job_id, checkpoint_id, kind, tier, actor, detail)
        SELECT job_id, checkpoint_id, 'promoted', tier, 'migration',
               jsonb_build_object('reason', '{WHY}')
        FROM healed
        """
    )


def downgrade() -> None:
    # The copies are intact: failing them again would only hide them.
    pass
