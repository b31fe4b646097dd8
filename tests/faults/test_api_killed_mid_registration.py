"""The API process SIGKILLed while a registration is in flight, at the worst moment: the catalog
has committed the checkpoint but the job never got the answer. The training-side client's
transport retries (connection reset, then refused until a new API process listens) and gets the
one checkpoint that exists, with 200: registration is idempotent by manifest digest (invariant 5),
so a retry after an ambiguous failure never makes a second checkpoint.

The hook is a real Postgres setting, nothing of ours changed: with `synchronous_standby_names`
naming a standby that never connects, a COMMIT writes its commit record and then waits for that
standby's acknowledgement. The test waits until the registration's backend is in that wait
(pg_stat_activity: SyncRep), so the checkpoint is committed locally and the API has not answered;
kills the API; clears the setting (the commit completes and becomes visible); and only then
starts a new API process on the same port for the client's retry to reach."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, text
from sqlalchemy.orm import Session
from tierpoint_client import Client
from tierpoint_client.transport import RetryPolicy

from apps.devstack.services import EmbeddedPostgres, free_port
from apps.worker import node_roots
from tests.helpers.api_process import api_process
from tests.helpers.faults import OVERALL_TIMEOUT, eventually, make_tier_dirs
from tests.helpers.lifecycle import NODES, new_job
from tests.helpers.services import Services, make_bucket, make_settings
from tests.helpers.tokens import create_token
from tierpoint.catalog.engine import make_sync_engine
from tierpoint.catalog.node.registry import upsert_node

STEP = 5
# Enough to outlast a new API process starting on a busy machine: retries every <= 0.5 s.
RETRY = RetryPolicy(attempts=400, initial_backoff=0.1, max_backoff=0.5)


def commits_wait_for_a_standby(engine: Engine, on: bool) -> None:
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        if on:
            conn.execute(text("ALTER SYSTEM SET synchronous_standby_names = 'never_connects'"))
        else:
            conn.execute(text("ALTER SYSTEM RESET synchronous_standby_names"))
        conn.execute(text("SELECT pg_reload_conf()"))


def waiting_commits(engine: Engine) -> int:
    with engine.connect() as conn:
        n = conn.scalar(text("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'"))
    return int(n or 0)


def rows_of(engine: Engine, job: str) -> dict[str, int]:
    with engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT (SELECT count(*) FROM checkpoint c JOIN job j ON j.id = c.job_id "
                "        WHERE j.name = :job),"
                "       (SELECT count(*) FROM shard s JOIN checkpoint c ON c.id = s.checkpoint_id "
                "        JOIN job j ON j.id = c.job_id WHERE j.name = :job),"
                "       (SELECT count(*) FROM event e JOIN job j ON j.id = e.job_id "
                "        WHERE j.name = :job AND e.kind = 'registered')"
            ),
            {"job": job},
        ).one()
    return {"checkpoints": row[0], "shards": row[1], "registered": row[2]}


async def test_api_sigkilled_after_commit_before_answer_retry_gets_the_one_checkpoint(
    dedicated_postgres: EmbeddedPostgres,
    services: Services,
    temporal_namespace: str,
    tmp_path: Path,
) -> None:
    pg = dedicated_postgres
    make_tier_dirs(tmp_path)
    cfg = make_settings(services, pg.url, tmp_path, make_bucket(services), temporal_namespace)
    engine = make_sync_engine(pg.url, pool_size=2)
    try:
        with Session(engine) as s:
            upsert_node(s, NODES[0], node_roots(cfg, NODES[0]))
            s.commit()
        job = new_job()
        shards = [
            {"path": f"rank-0/shard-{i}.bin", "size": 100, "crc32c": "0badf00d", "node": NODES[0]}
            for i in range(4)
        ]
        port = free_port()
        trainer = create_token(engine, scopes=[f"train:{job}"])
        client = Client(f"http://127.0.0.1:{port}", token=trainer, retry=RETRY)
        registration: asyncio.Future[dict[str, Any]] | None = None

        with api_process(cfg, port, tmp_path / "api-1.log") as first:
            await asyncio.to_thread(first.wait_ready)
            # The token's first use records its last_used_at (a commit of its own, at most once a
            # minute): done now, so that the only commit held below is the registration's.
            await asyncio.to_thread(client.tiers)
            await asyncio.to_thread(commits_wait_for_a_standby, engine, True)
            try:
                registration = asyncio.ensure_future(
                    asyncio.to_thread(client.register_manifest, job, STEP, shards)
                )

                async def committing() -> bool:
                    assert not registration.done(), registration
                    return await asyncio.to_thread(waiting_commits, engine) > 0

                await eventually("the registration's COMMIT waits for the standby", committing)
                assert first.kill() == -9
                # Not visible while it waits: the answer the job never got is the only news.
                assert rows_of(engine, job)["checkpoints"] == 0
            finally:
                await asyncio.to_thread(commits_wait_for_a_standby, engine, False)

        async def committed() -> bool:
            return (await asyncio.to_thread(rows_of, engine, job))["checkpoints"] == 1

        await eventually("the killed API's commit completed", committed)
        assert not registration.done(), "the client gave up while no API was listening"

        with api_process(cfg, port, tmp_path / "api-2.log") as second:
            result = await asyncio.wait_for(registration, OVERALL_TIMEOUT)
            assert second.alive(), second.output()
            again = await asyncio.to_thread(client.register_manifest, job, STEP, shards)

        assert result["job"] == job and result["step"] == STEP and result["shard_count"] == 4
        stable = ("job", "step", "created_at", "shard_count", "total_bytes", "metadata")
        assert {k: again[k] for k in stable} == {k: result[k] for k in stable}
        assert rows_of(engine, job) == {"checkpoints": 1, "shards": 4, "registered": 1}
    finally:
        engine.dispose()
