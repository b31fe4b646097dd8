"""The triggers that keep `job_tier_usage` (bytes and checkpoints each job holds on each tier) equal
to the sum over its restorable and expiring markers, so the jobs overview reads one row per job
and tier instead of summing the job's whole history.

In the database rather than in the code that flips markers: every path that changes a marker's
state (promotion, retention, repair, a test's direct SQL) keeps the totals right, in the same
transaction. Each marker flip locks one (job, tier) row until its transaction commits; flips are
one marker per transaction, so this serialises nothing that was parallel.

A marker's delete after its checkpoint's (a cascade) cannot read the checkpoint's bytes any
more: the checkpoint's own delete subtracts its held markers first, and the marker's delete then
finds no checkpoint and changes nothing. Within a job's delete nothing is counted (its totals go
with it, and updating them would refer to a job already gone).
"""

from __future__ import annotations

HELD_STATES = ("restorable", "expiring")

_HELD = "('restorable', 'expiring')"

CREATE_FUNCTIONS = (
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

CREATE_TRIGGERS = (
    "CREATE TRIGGER job_tier_usage_marker AFTER INSERT OR DELETE OR UPDATE OF state "
    "ON checkpoint_tier FOR EACH ROW EXECUTE FUNCTION job_tier_usage_marker()",
    "CREATE TRIGGER job_tier_usage_checkpoint BEFORE DELETE "
    "ON checkpoint FOR EACH ROW EXECUTE FUNCTION job_tier_usage_checkpoint()",
)

DROP = (
    "DROP TRIGGER IF EXISTS job_tier_usage_checkpoint ON checkpoint",
    "DROP TRIGGER IF EXISTS job_tier_usage_marker ON checkpoint_tier",
    "DROP FUNCTION IF EXISTS job_tier_usage_checkpoint()",
    "DROP FUNCTION IF EXISTS job_tier_usage_marker()",
)

# The totals recomputed from the tier copies: for a catalog filled while the triggers did not fire.
BACKFILL = f"""INSERT INTO job_tier_usage (job_id, tier, bytes, checkpoints)
SELECT ct.job_id, ct.tier, sum(c.total_bytes), count(*)
FROM checkpoint_tier ct JOIN checkpoint c ON c.id = ct.checkpoint_id
WHERE ct.state IN {_HELD}
GROUP BY ct.job_id, ct.tier"""
