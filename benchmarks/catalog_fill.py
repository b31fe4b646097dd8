"""Fill a migrated catalog with a large synthetic history, set-based: one INSERT ... SELECT over
generate_series per table, so a million shards take seconds rather than the hours a row-by-row
ORM load would.

The mix, per job (checkpoints every 10 minutes, `shards` shards each, replicas on the three tiers
`ssd` (node-local), `lustre` (shared) and `s3`):
- most checkpoints restorable on every tier;
- the newest checkpoint of every fifth job still pending on s3: half its s3 replicas verified, one
  copying, the rest pending (the copies in flight);
- one checkpoint in a hundred failed on s3, with a replica error (the failures);
- every third checkpoint older than the five newest expired on ssd (retention's local window).
Even jobs keep all their shards on one node, odd ones spread them over two.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import psycopg

from tierpoint.catalog import usage_rollup

NODES = 16
TIERS = ("ssd", "lustre", "s3")
SHARD_BYTES = 256 << 20
INTERVAL = "10 minutes"


@dataclass(frozen=True)
class Catalog:
    jobs: int
    checkpoints_per_job: int
    shards_per_checkpoint: int

    @property
    def checkpoints(self) -> int:
        return self.jobs * self.checkpoints_per_job

    @property
    def shards(self) -> int:
        return self.checkpoints * self.shards_per_checkpoint


def job_name(j: int) -> str:
    return f"job-{j:05d}"


def home_node(j: int) -> str:
    """The node of a job's first shard: the node its restores ask from."""
    return f"node-{j % NODES:02d}"


# Rank 0 is a job's newest checkpoint; the class decides every marker and replica of it.
_CLASSES = """
CREATE TEMP TABLE bench_class AS
SELECT c.id, c.job_id, c.step, c.created_at,
       CASE
         WHEN r = 0 AND c.job_id %% 5 = 0 THEN 'inflight'
         WHEN r > 0 AND c.id %% 100 = 7 THEN 'failed'
         WHEN r >= 5 AND (c.step / 100) %% 3 = 0 THEN 'expired_local'
         ELSE 'ok'
       END AS cls
FROM (SELECT id, job_id, step, created_at, %(per_job)s - 1 - step / 100 AS r FROM checkpoint) c
"""

_STATEMENTS = (
    "INSERT INTO node (id, local_roots, last_seen_at) "
    "SELECT format('node-%%s', lpad(n::text, 2, '0')), '{}'::jsonb, now() "
    "FROM generate_series(0, %(nodes)s - 1) n",
    "INSERT INTO job (id, name, created_at) "
    "SELECT j, format('job-%%s', lpad(j::text, 5, '0')), now() - interval '400 days' "
    "FROM generate_series(1, %(jobs)s) j",
    # id = (job - 1) * per_job + k + 1: the ids of a job are contiguous, its steps k * 100.
    "INSERT INTO checkpoint (id, job_id, step, created_at, metadata, total_bytes, shard_count, "
    "manifest_digest, workflow_started_at) "
    "SELECT (j - 1) * %(per_job)s + k + 1, j, k * 100, "
    "  now() - (%(per_job)s - 1 - k) * interval '" + INTERVAL + "' - j * interval '1 second', "
    "  jsonb_build_object('loss', 1.0 / (k + 1)), %(shards)s::bigint * %(shard_bytes)s, "
    "  %(shards)s, md5(j::text || ':' || k::text) || md5(k::text || ':' || j::text), "
    "  now() - (%(per_job)s - 1 - k) * interval '" + INTERVAL + "' - j * interval '1 second' "
    "FROM generate_series(1, %(jobs)s) j, generate_series(0, %(per_job)s - 1) k",
    "INSERT INTO shard (id, checkpoint_id, ordinal, path, size, checksum, node_id) "
    "SELECT (c.id - 1) * %(shards)s + o + 1, c.id, o, "
    "  format('model/rank-%%s.safetensors', lpad(o::text, 4, '0')), %(shard_bytes)s, "
    "  lpad(to_hex(((c.id * 7919 + o * 104729) %% 4294967291)::bigint), 8, '0'), "
    "  format('node-%%s', lpad(((c.job_id + (c.job_id %% 2) * (o %% 2)) %% %(nodes)s)::text,"
    "   2, '0')) "
    "FROM checkpoint c, generate_series(0, %(shards)s - 1) o",
    _CLASSES,
    "INSERT INTO checkpoint_tier (checkpoint_id, tier, job_id, step, state, reason, "
    "restorable_at, updated_at) "
    "SELECT b.id, t.tier, b.job_id, b.step, x.state, x.reason, "
    "  CASE WHEN x.state IN ('restorable', 'expired') "
    "    THEN b.created_at + t.lag * interval '1 second' END, "
    "  b.created_at + t.lag * interval '1 second' "
    "FROM bench_class b "
    "CROSS JOIN (VALUES ('ssd', 2), ('lustre', 40), ('s3', 300)) AS t(tier, lag) "
    "CROSS JOIN LATERAL (SELECT CASE "
    "    WHEN t.tier = 's3' AND b.cls = 'inflight' THEN 'pending' "
    "    WHEN t.tier = 's3' AND b.cls = 'failed' THEN 'failed' "
    "    WHEN t.tier = 'ssd' AND b.cls = 'expired_local' THEN 'expired' "
    "    ELSE 'restorable' END AS state, "
    "  CASE WHEN t.tier = 's3' AND b.cls = 'failed' "
    "    THEN 'copy to s3 failed after 5 attempts' END AS reason) x",
    # id = (shard - 1) * 3 + tier: replicas in shard order, tiers fastest first.
    "INSERT INTO replica (id, shard_id, checkpoint_id, tier, node_id, state, location, "
    "bytes_done, verified_at, error, updated_at) "
    "SELECT (s.id - 1) * 3 + t.n, s.id, s.checkpoint_id, t.tier, "
    "  CASE WHEN t.tier = 'ssd' THEN s.node_id END, x.state, "
    "  format('%%s/%%s/%%s', t.tier, s.checkpoint_id, s.path), "
    "  CASE x.state WHEN 'verified' THEN s.size WHEN 'copying' THEN s.size / 2 ELSE 0 END, "
    "  CASE WHEN x.state IN ('verified', 'expired') "
    "    THEN b.created_at + t.lag * interval '1 second' END, "
    "  CASE WHEN x.state = 'pending' AND b.cls = 'failed' "
    "    THEN 'upload of part 3 failed: connection reset by peer' END, "
    "  b.created_at + t.lag * interval '1 second' "
    "FROM shard s JOIN bench_class b ON b.id = s.checkpoint_id "
    "CROSS JOIN (VALUES (1, 'ssd', 2), (2, 'lustre', 40), (3, 's3', 300)) AS t(n, tier, lag) "
    "CROSS JOIN LATERAL (SELECT CASE "
    "    WHEN t.tier = 's3' AND b.cls = 'inflight' THEN "
    "      CASE WHEN s.ordinal < %(shards)s / 2 THEN 'verified' "
    "           WHEN s.ordinal = %(shards)s / 2 THEN 'copying' ELSE 'pending' END "
    "    WHEN t.tier = 's3' AND b.cls = 'failed' AND s.ordinal = 0 THEN 'pending' "
    "    WHEN t.tier = 'ssd' AND b.cls = 'expired_local' THEN 'expired' "
    "    ELSE 'verified' END AS state) x",
    "DROP TABLE bench_class",
    # The triggers that keep these totals do not fire in this session (replication role).
    usage_rollup.BACKFILL,
    "SELECT setval(pg_get_serial_sequence('job', 'id'), %(jobs)s)",
    "SELECT setval(pg_get_serial_sequence('checkpoint', 'id'), %(checkpoints)s)",
    "SELECT setval(pg_get_serial_sequence('shard', 'id'), %(shard_rows)s)",
    "SELECT setval(pg_get_serial_sequence('replica', 'id'), %(shard_rows)s * 3)",
)

BIG_TABLES = ("checkpoint", "shard", "replica", "checkpoint_tier")

# The secondary indexes (not those behind a constraint) of the tables filled: dropped for the
# load and rebuilt from their own definitions, which is several times faster than maintaining
# them row by row, and leaves exactly the migrated schema.
_SECONDARY = """
SELECT i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid)
FROM pg_index i
WHERE i.indrelid = ANY(%s::regclass[])
  AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid)
"""


def fill(url: str, catalog: Catalog) -> dict[str, float]:
    """Load `catalog` into the empty, migrated catalog at `url` (a libpq URL); returns the seconds
    each phase took."""
    params = {
        "nodes": NODES,
        "jobs": catalog.jobs,
        "per_job": catalog.checkpoints_per_job,
        "shards": catalog.shards_per_checkpoint,
        "shard_bytes": SHARD_BYTES,
        "checkpoints": catalog.checkpoints,
        "shard_rows": catalog.shards,
    }
    took: dict[str, float] = {}
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = off")
        conn.execute("SET maintenance_work_mem = '512MB'")
        # The foreign keys hold by construction; their per-row trigger checks are skipped.
        conn.execute("SET session_replication_role = replica")
        indexes = conn.execute(_SECONDARY, (list(BIG_TABLES),)).fetchall()
        for name, _ in indexes:
            conn.execute(f"DROP INDEX {name}")
        t0 = time.perf_counter()
        for sql in _STATEMENTS:
            conn.execute(sql, params)
        took["insert"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _, definition in indexes:
            conn.execute(definition)
        took["index"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        conn.execute("SET session_replication_role = origin")
        conn.execute("VACUUM (ANALYZE)")
        took["analyze"] = time.perf_counter() - t0
    return took
