from __future__ import annotations

from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, create_engine, func, insert, inspect, select, update
from sqlalchemy.orm import Session

from tests.helpers.services import fresh_database
from tierpoint.catalog import migrate
from tierpoint.catalog.checkpoint.registration import register_checkpoint
from tierpoint.catalog.engine import make_sync_engine
from tierpoint.catalog.models import (
    Base,
    Checkpoint,
    Event,
    Job,
    JobTierUsage,
    Node,
    Replica,
    Shard,
    TierCopy,
)
from tierpoint.catalog.node.registry import upsert_node
from tierpoint.catalog.reads.latest import latest_restorable
from tierpoint.catalog.timeline.branches import rollback
from tierpoint.errors import CheckpointConflict
from tierpoint.manifest import Manifest, ShardSpec
from tierpoint.tier_config import TierConfig, TierKind


@pytest.fixture
def empty_url(postgres_url: str) -> str:
    return fresh_database(postgres_url)


def _tables(url: str) -> set[str]:
    engine = make_sync_engine(url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_upgrade_downgrade_upgrade(empty_url: str) -> None:
    migrate.upgrade(empty_url)
    assert {"checkpoint", "shard", "replica", "checkpoint_tier", "event", "node", "job"} <= _tables(
        empty_url
    )
    migrate.downgrade(empty_url, "base")
    assert _tables(empty_url) <= {"alembic_version"}
    migrate.upgrade(empty_url)
    engine = make_sync_engine(empty_url)
    try:
        migrate.check_schema(engine)
    finally:
        engine.dispose()


def test_models_and_migrations_do_not_drift(migrated_url: str) -> None:
    engine = make_sync_engine(migrated_url)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            diff = compare_metadata(ctx, Base.metadata)
    finally:
        engine.dispose()
    assert diff == []


def test_refuses_unmigrated_schema(empty_url: str) -> None:
    engine = make_sync_engine(empty_url)
    try:
        with pytest.raises(migrate.SchemaMismatch, match="tierpoint migrate"):
            migrate.check_schema(engine)
    finally:
        engine.dispose()


def test_refuses_newer_schema(empty_url: str) -> None:
    migrate.upgrade(empty_url)
    engine = create_engine(empty_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql("UPDATE alembic_version SET version_num = 'ffff_future'")
        with pytest.raises(migrate.SchemaMismatch, match="newer"):
            migrate.check_schema(engine)
    finally:
        engine.dispose()


def _failed_by_a_lost_node(
    session: Session, job_id: int, step: int, lost: str, *states: str
) -> int:
    """A checkpoint whose ssd copy a declaration of `lost` failed; its shards' ssd replicas are in
    `states`, on node-w (alive) unless the state is `lost` (then on `lost`)."""
    cp = session.scalar(
        insert(Checkpoint)
        .values(
            job_id=job_id,
            step=step,
            total_bytes=10,
            shard_count=len(states),
            manifest_digest=f"d{step}",
        )
        .returning(Checkpoint.id)
    )
    assert cp is not None
    for i, state in enumerate(states):
        node = lost if state == "lost" else "node-w"
        shard = session.scalar(
            insert(Shard)
            .values(
                checkpoint_id=cp, ordinal=i, path=f"s{i}", size=5, checksum="0badf00d", node_id=node
            )
            .returning(Shard.id)
        )
        session.execute(
            insert(Replica).values(
                shard_id=shard,
                checkpoint_id=cp,
                tier="ssd",
                state=state,
                node_id=node,
                location=f"/ssd/{node}/s{i}",
            )
        )
    session.execute(
        insert(TierCopy).values(
            checkpoint_id=cp,
            tier="ssd",
            job_id=job_id,
            step=step,
            state="failed",
            reason=f"node {lost} was declared lost: its local copies are gone",
        )
    )
    return int(cp)


def test_local_copies_a_lost_holder_failed_are_restorable_again(empty_url: str) -> None:
    """A catalog from before the fix, where a node that held only peer copies failed intact local
    copies: upgrading makes those restorable (counted in the usage totals, with an event), and
    leaves failed the copies that lost bytes."""
    migrate.upgrade(empty_url, "0013")
    engine = make_sync_engine(empty_url)
    try:
        with Session(engine) as s, s.begin():
            for node in ("node-w", "node-h", "node-x"):
                upsert_node(s, node, {})
            s.execute(
                update(Node).where(Node.id.in_(["node-h", "node-x"])).values(lost_at=func.now())
            )
            job_id = s.scalar(insert(Job).values(name="job-heal").returning(Job.id))
            assert job_id is not None
            intact = _failed_by_a_lost_node(s, job_id, 1, "node-h", "verified", "verified")
            gone = _failed_by_a_lost_node(s, job_id, 2, "node-x", "verified", "lost")
            rotten = _failed_by_a_lost_node(s, job_id, 3, "node-h", "verified", "corrupt")
        migrate.upgrade(empty_url)
        with Session(engine) as s:
            states = dict(s.execute(select(TierCopy.checkpoint_id, TierCopy.state)).all())
            assert states == {intact: "restorable", gone: "failed", rotten: "failed"}, states
            usage = s.execute(select(JobTierUsage.tier, JobTierUsage.checkpoints)).all()
            assert usage == [("ssd", 1)], usage
            (event,) = s.execute(select(Event.checkpoint_id, Event.kind, Event.actor)).all()
            assert tuple(event) == (intact, "promoted", "migration")
    finally:
        engine.dispose()


def test_a_catalog_from_before_branches_upgrades_with_its_checkpoints_on_branch_one(
    empty_url: str,
) -> None:
    """Migration 0016 on a catalog with a job's history: every checkpoint is on branch 1 and on
    the timeline, nothing else of it changes, the newest is still latest restorable with the
    same plan, and a step is still saved once (the same manifest again is the same checkpoint,
    another one a conflict)."""
    migrate.upgrade(empty_url, "0015")
    engine = make_sync_engine(empty_url)
    cols = "c.id, c.step, c.created_at, c.metadata, c.pinned, c.manifest_digest, c.total_bytes"
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql("INSERT INTO job (name) VALUES ('old-run')")
            for step in (100, 200, 300):
                conn.exec_driver_sql(
                    "INSERT INTO checkpoint (job_id, step, total_bytes, shard_count, "
                    "manifest_digest, metadata) SELECT id, %s, 5, 1, %s, '{\"loss\": 1.5}' "
                    "FROM job WHERE name = 'old-run'",
                    (step, f"digest-{step}"),
                )
                conn.exec_driver_sql(
                    "INSERT INTO shard (checkpoint_id, ordinal, path, size, checksum, node_id) "
                    "SELECT id, 0, 'model.bin', 5, '0badf00d', 'node-a' FROM checkpoint "
                    "WHERE step = %s",
                    (step,),
                )
                conn.exec_driver_sql(
                    "INSERT INTO checkpoint_tier (checkpoint_id, tier, job_id, step, state, "
                    "restorable_at) SELECT id, 'lustre', job_id, step, 'restorable', now() "
                    "FROM checkpoint WHERE step = %s",
                    (step,),
                )
                conn.exec_driver_sql(
                    "INSERT INTO replica (shard_id, checkpoint_id, tier, state, location, "
                    "bytes_done, verified_at) SELECT s.id, s.checkpoint_id, 'lustre', "
                    "'verified', '/lustre/old-run/' || %s || '/model.bin', 5, now() "
                    "FROM shard s JOIN checkpoint c ON c.id = s.checkpoint_id WHERE c.step = %s",
                    (str(step), step),
                )
            before = conn.exec_driver_sql(f"SELECT {cols} FROM checkpoint c ORDER BY c.id").all()
        engine.dispose()

        migrate.upgrade(empty_url)
        engine = make_sync_engine(empty_url)
        with engine.connect() as conn:
            after = conn.exec_driver_sql(f"SELECT {cols} FROM checkpoint c ORDER BY c.id").all()
            timeline = conn.exec_driver_sql(
                "SELECT branch, superseded_by, parent_id, health FROM checkpoint"
            ).all()
            branches = conn.exec_driver_sql("SELECT number, parent, from_step FROM branch").all()
            current = conn.exec_driver_sql("SELECT current_branch FROM job").scalar_one()
        assert after == before
        assert set(timeline) == {(1, None, None, None)}
        assert branches == [(1, None, None)] and current == 1

        lustre = TierConfig(name="lustre", kind=TierKind.SHARED, root="/lustre")
        with Session(engine) as s:
            latest = latest_restorable(s, "old-run", [lustre])
            assert latest.step == 300 and latest.checkpoint.branch == 1
            assert [e.location for e in latest.plan] == ["/lustre/old-run/300/model.bin"]
            shard = ShardSpec(path="model.bin", size=5, crc32c=None, node="node-a")
            upsert_node(s, "node-a", {})
            with pytest.raises(CheckpointConflict):
                register_checkpoint(s, "old-run", Manifest(step=300, shards=[shard]), ["lustre"])
    finally:
        engine.dispose()


def test_a_catalog_that_rolled_back_refuses_to_go_below_0016_and_keeps_everything(
    empty_url: str,
) -> None:
    """Step 20 saved on branch 1, a rollback to 10, step 20 saved again on branch 2: going back
    to 0015 would have to merge the two step-20 checkpoints (the old unique key) and could not
    name the second one's files. The downgrade refuses before it changes anything, saying how
    many checkpoints are in the way and what to do."""
    migrate.upgrade(empty_url)
    engine = make_sync_engine(empty_url)
    try:
        with Session(engine) as s:
            upsert_node(s, "node-a", {})
            for step in (10, 20, 30):
                shard = ShardSpec(path=f"{step}.bin", size=5, crc32c=None, node="node-a")
                register_checkpoint(s, "rolled", Manifest(step=step, shards=[shard]), ["lustre"])
            s.commit()
            # Step 10 copied to the shared tier, as its lifecycle would leave it.
            s.execute(
                update(Replica)
                .where(Replica.checkpoint_id == _step_id(s, 10))
                .values(state="verified", verified_at=func.now())
            )
            s.execute(
                update(TierCopy)
                .where(TierCopy.checkpoint_id == _step_id(s, 10))
                .values(state="restorable", restorable_at=func.now())
            )
            s.commit()
            rollback(s, "rolled", 10, from_branch=1, reason="loss spike", actor="ops")
            s.commit()
            shard = ShardSpec(path="again.bin", size=5, crc32c=None, node="node-a")
            again = Manifest(step=20, shards=[shard], branch=2)
            register_checkpoint(s, "rolled", again, ["lustre"])
            s.commit()
        before = _catalog_rows(engine)
        engine.dispose()

        with pytest.raises(RuntimeError) as refused:
            migrate.downgrade(empty_url, "0015")
        message = str(refused.value)
        assert "2 checkpoint(s) share a step" in message, message
        assert "1 checkpoint(s) were saved on a branch after the first" in message, message
        assert "backup" in message and "Nothing was changed" in message, message

        engine = make_sync_engine(empty_url)
        assert _catalog_rows(engine) == before
        migrate.check_schema(engine)
    finally:
        engine.dispose()


def _catalog_rows(engine: Engine) -> tuple[list[Any], list[Any], str]:
    with engine.connect() as conn:
        checkpoints = conn.exec_driver_sql(
            "SELECT id, step, branch, superseded_by FROM checkpoint ORDER BY id"
        ).all()
        branches = conn.exec_driver_sql("SELECT number, parent, from_step FROM branch").all()
        version = conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalar_one()
    return list(checkpoints), list(branches), version


def _step_id(s: Session, step: int) -> int:
    found = s.scalar(select(Checkpoint.id).where(Checkpoint.step == step))
    assert found is not None
    return found
