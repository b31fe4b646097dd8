"""Retention execution end to end on the real stack: Temporal dev server, Postgres, moto S3, real
files on two nodes' local roots and a shared root, real workers (apps.worker.run_workers)."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import pytest
from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client, ScheduleDescription, ScheduleHandle

from activities.retention import RetentionActivities
from activities.stores import Stores
from tests.helpers.lifecycle import (
    RESULT_TIMEOUT,
    record_history,
    recording_histories,
    running_workers,
)
from tests.helpers.retention import (
    NODES,
    create_job,
    latest,
    markers,
    replica_states,
    s3_keys,
    set_policy,
    settle,
    steps_on_disk,
    utcnow,
    wait_for,
    write_checkpoint,
)
from tests.helpers.services import Services
from tierpoint.catalog.models import Event, Job, RestoreLease
from tierpoint.config import Settings
from tierpoint.contract.lifecycle import workflow_id
from tierpoint.contract.retention import (
    BEGIN,
    BEGIN_ROUND,
    SWEEP_SCHEDULE_ID,
    SWEEP_WORKFLOW,
    DeleteInput,
    ExpiryInput,
    RetentionPlanInput,
    retention_workflow_id,
)
from tierpoint.temporal import ensure_sweep_schedule, request_retention

ISSUE_POLICY = {
    "tiers": {
        "ssd": {"keep_last": 2},
        "lustre": {"keep_last": 4},
        "s3": {"promote_every": 3, "keep_every": 6},
    }
}
KEEP_ALL: dict[str, object] = {"tiers": {}}
SSD_LAST_1 = {"tiers": {"ssd": {"keep_last": 1}}}
SSD_NONE = {"tiers": {"ssd": {"keep_last": 0}}}


def new_job() -> str:
    return f"ret-{uuid.uuid4().hex[:10]}"


async def test_issue_scenario_leaves_exactly_what_the_policy_says(
    settings: Settings, sessions: sessionmaker[Session], client: Client, services: Services
) -> None:
    job = new_job()
    create_job(sessions, job, ISSUE_POLICY)
    shards: dict[int, set[str]] = {}
    async with running_workers(settings, client):
        for step in range(1, 13):
            seeded, result = await write_checkpoint(settings, sessions, client, job, step)
            shards[step] = {sh.path for sh in seeded.shards}
            targets = [t.tier for t in result.tiers]
            # promote_every=3 on s3, by step multiple: only 3, 6, 9, 12 go there.
            assert targets == (["ssd", "lustre", "s3"] if step % 3 == 0 else ["ssd", "lustre"])
            assert all(t.state == "restorable" for t in result.tiers), result
        outcome = await settle(client, job)
        assert outcome.failed == 0
        if recording_histories():
            # A lifecycle with a skipped tier (promote_every) and a retention request per promote.
            await record_history(client, workflow_id(job, 11), "lifecycle_skips_s3")
            await record_history(client, workflow_id(job, 12), "lifecycle_requests_retention")

    kept = {"ssd": {11, 12}, "lustre": {9, 10, 11, 12}, "s3": {6, 12}}
    sent = {"ssd": set(range(1, 13)), "lustre": set(range(1, 13)), "s3": {3, 6, 9, 12}}

    # Bytes on disk: both nodes' local roots, the shared root, S3.
    for node in NODES:
        root = settings.tier("ssd").root_for(node)
        assert steps_on_disk(root, job) == kept["ssd"], node
        for step in kept["ssd"]:
            files = {
                p.relative_to(root / job / str(step)).as_posix()
                for p in (root / job / str(step)).rglob("*")
                if p.is_file()
            }
            assert files == {p for p in shards[step] if p.startswith(f"rank-{node}/")}
    lustre = settings.tier("lustre").root_for(None)
    assert steps_on_disk(lustre, job) == kept["lustre"]
    in_s3 = s3_keys(services, settings, job)
    assert set(in_s3) == kept["s3"]
    for step in kept["s3"]:
        assert in_s3[step] == shards[step]

    # The catalog agrees: markers, and every replica of each copy.
    state = markers(sessions, job)
    assert {tier for _, tier in state} == {"ssd", "lustre", "s3"}
    for tier in ("ssd", "lustre", "s3"):
        on_tier = {step: st for (step, t), st in state.items() if t == tier}
        # A tier the policy skipped (promote_every) has no marker at all.
        assert set(on_tier) == sent[tier], tier
        assert {s for s, st in on_tier.items() if st == "restorable"} == kept[tier], tier
        assert {s for s, st in on_tier.items() if st == "expired"} == sent[tier] - kept[tier]
    replicas = replica_states(sessions, job)
    for (step, tier), st in state.items():
        assert replicas[(step, tier)] == ({"verified"} if st == "restorable" else {"expired"}), (
            step,
            tier,
        )

    assert (await latest(settings, job)).step == 12
    assert (await latest(settings, job, tier="s3")).step == 12

    # Every expiry recorded its rule.
    with sessions() as s:
        rules = s.scalars(
            select(Event.detail)
            .join(Job, Job.id == Event.job_id)
            .where(Job.name == job, Event.kind == "expired")
        ).all()
    expired_count = sum(len(sent[t] - kept[t]) for t in sent)
    assert len(rules) == expired_count
    assert {d["rule"] for d in rules} == {"not_kept"}


async def test_crash_between_begin_and_delete_is_finished_by_the_next_run(
    settings: Settings, sessions: sessionmaker[Session], client: Client
) -> None:
    job = new_job()
    policy_id = create_job(sessions, job, KEEP_ALL)
    async with running_workers(settings, client):
        for step in (1, 2, 3):
            await write_checkpoint(settings, sessions, client, job, step)
        await settle(client, job)
    assert all(st == "restorable" for st in markers(sessions, job).values())

    # Workers are down. The policy now keeps nothing on ssd (the copies are durable elsewhere).
    # Run a pass by hand as the workflow would, and "crash" after beginning the expiry of the
    # newest ssd copy and deleting it on one of its two nodes.
    set_policy(sessions, policy_id, SSD_NONE)
    stores = Stores(settings)
    shared = RetentionActivities(sessions, settings, stores)
    planned = shared.plan(RetentionPlanInput(job=job))
    assert [(t.step, t.tier, t.rule) for t in planned.tasks] == [
        (1, "ssd", "not_kept"),
        (2, "ssd", "not_kept"),
        (3, "ssd", "not_kept"),
    ]
    newest = planned.tasks[2]
    assert sorted(newest.nodes) == sorted(NODES)
    ref = ExpiryInput(job=job, checkpoint_id=newest.checkpoint_id, tier="ssd")
    assert shared.begin_expiry(ref).state == "expiring"
    # Begin again (a retried activity): still expiring, nothing else changes.
    assert shared.begin_expiry(ref).state == "expiring"
    node_a = RetentionActivities(sessions, settings, stores, node="node-a")
    node_a.delete_copy(
        DeleteInput(job=job, checkpoint_id=newest.checkpoint_id, step=3, tier="ssd", node="node-a")
    )
    root_a = settings.tier("ssd").root_for("node-a")
    root_b = settings.tier("ssd").root_for("node-b")
    assert steps_on_disk(root_a, job) == {1, 2}
    assert steps_on_disk(root_b, job) == {1, 2, 3}

    # Bytes gone on one node, going on the other: no reader is sent to step 3 on ssd.
    assert markers(sessions, job)[(3, "ssd")] == "expiring"
    assert replica_states(sessions, job)[(3, "ssd")] == {"expiring"}
    for node in NODES:
        answer = await latest(settings, job, node=node)
        assert answer.step == 3
        assert answer.plan and {e.tier for e in answer.plan} & {"ssd"} == set()

    # A node worker refuses to delete bytes of a copy that is still restorable (invariant 3).
    with pytest.raises(Exception, match="not expiring"):
        node_a.delete_copy(
            DeleteInput(
                job=job,
                checkpoint_id=planned.tasks[1].checkpoint_id,
                step=2,
                tier="ssd",
                node="node-a",
            )
        )
    assert steps_on_disk(root_a, job) == {1, 2}

    # The next run picks up the unfinished expiry first (it is never turned back) and completes
    # it, then the rest.
    assert [(t.step, t.rule) for t in shared.plan(RetentionPlanInput(job=job)).tasks] == [
        (3, None),
        (1, "not_kept"),
        (2, "not_kept"),
    ]
    async with running_workers(settings, client):
        outcome = await settle(client, job)
        if recording_histories():
            await record_history(client, retention_workflow_id(job), "job_retention_resumes")
        history = await client.get_workflow_handle(retention_workflow_id(job)).fetch_history()
    assert outcome.expired == 3 and outcome.failed == 0
    # The round's three copies, the unfinished one among them, were begun by one activity: the
    # job was planned again once for the round, not once a copy.
    scheduled = [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]
    assert scheduled.count(BEGIN_ROUND) == 1 and BEGIN not in scheduled, scheduled
    state = markers(sessions, job)
    assert {step: st for (step, tier), st in state.items() if tier == "ssd"} == {
        1: "expired",
        2: "expired",
        3: "expired",
    }
    assert all(st == "restorable" for (_, tier), st in state.items() if tier != "ssd")
    assert replica_states(sessions, job)[(3, "ssd")] == {"expired"}
    for root in (root_a, root_b):
        assert steps_on_disk(root, job) == set()
    assert steps_on_disk(settings.tier("lustre").root_for(None), job) == {1, 2, 3}
    assert (await latest(settings, job)).step == 3
    with sessions() as s:
        details = s.scalars(
            select(Event.detail)
            .join(Job, Job.id == Event.job_id)
            .where(Job.name == job, Event.kind == "expired", Event.tier == "ssd")
            .order_by(Event.id)
        ).all()
    # The resumed expiry carries the rule its `expiring` event recorded.
    assert [d["rule"] for d in details] == ["not_kept"] * 3


@pytest.mark.parametrize("ending", ["released", "timed_out"])
async def test_lease_blocks_expiry_until_released_or_timed_out(
    ending: str, settings: Settings, sessions: sessionmaker[Session], client: Client
) -> None:
    job = new_job()
    create_job(sessions, job, SSD_LAST_1)
    root = settings.tier("ssd").root_for("node-a")
    async with running_workers(settings, client):
        first, _ = await write_checkpoint(settings, sessions, client, job, 1)
        await settle(client, job)
        with sessions.begin() as s:
            lease_id = s.scalar(
                insert(RestoreLease)
                .values(
                    checkpoint_id=first.checkpoint_id,
                    holder="test",
                    expires_at=utcnow(sessions) + timedelta(hours=1),
                )
                .returning(RestoreLease.id)
            )
        # Step 2's promotions ask for retention; keep_last=1 on ssd wants step 1 gone, the lease
        # holds it.
        await write_checkpoint(settings, sessions, client, job, 2)
        held = await settle(client, job)
        assert markers(sessions, job)[(1, "ssd")] == "restorable"
        assert 1 in steps_on_disk(root, job)
        assert held.expired == 0

        with sessions.begin() as s:
            values = (
                {"released_at": utcnow(sessions)}
                if ending == "released"
                else {"expires_at": utcnow(sessions) - timedelta(seconds=1)}
            )
            s.execute(update(RestoreLease).where(RestoreLease.id == lease_id).values(**values))
        done = await settle(client, job)
    assert done.expired == 1
    assert markers(sessions, job)[(1, "ssd")] == "expired"
    for node in NODES:
        assert steps_on_disk(settings.tier("ssd").root_for(node), job) == {2}


async def test_sweep_schedule_exists_is_idempotent_and_requests_runs(
    settings: Settings, sessions: sessionmaker[Session], client: Client
) -> None:
    job = new_job()
    create_job(sessions, job, KEEP_ALL)
    async with running_workers(settings, client, nodes=()):
        handle = client.get_schedule_handle(SWEEP_SCHEDULE_ID)
        desc = await _described(handle)
        action = desc.schedule.action
        assert getattr(action, "workflow", None) == SWEEP_WORKFLOW
        assert [i.every for i in desc.schedule.spec.intervals] == [
            settings.retention_sweep_interval
        ]
        # Again, as a second shared worker would: harmless, nothing changes.
        await ensure_sweep_schedule(client, settings.retention_sweep_interval)
        await ensure_sweep_schedule(client, settings.retention_sweep_interval)
        again = await handle.describe()
        assert again.schedule.spec.intervals == desc.schedule.spec.intervals
        assert getattr(again.schedule.action, "workflow", None) == SWEEP_WORKFLOW

        # Fire it now: the sweep requests a retention run for every job, ours included.
        await handle.trigger()
        await _wait_for_workflow(client, retention_workflow_id(job))
        result = await settle(client, job, request=False)
        assert result.expired == 0


async def _described(handle: ScheduleHandle) -> ScheduleDescription:
    """The schedule as Temporal describes it, once there: the shared worker makes it as it
    starts, after `running_workers` has begun (in a session where no test made it before, the
    first describe may come first)."""
    from temporalio.service import RPCError, RPCStatusCode

    async with asyncio.timeout(RESULT_TIMEOUT):
        while True:
            try:
                return await handle.describe()
            except RPCError as err:
                if err.status is not RPCStatusCode.NOT_FOUND:
                    raise
            await asyncio.sleep(0.2)


async def _wait_for_workflow(client: Client, workflow_id: str) -> None:
    import asyncio

    from temporalio.service import RPCError

    handle = client.get_workflow_handle(workflow_id)
    for _ in range(2400):
        try:
            await handle.describe()
            return
        except RPCError:
            await asyncio.sleep(0.2)
    raise AssertionError(f"{workflow_id} was never started")


def test_job_table_is_the_sweep_source(sessions: sessionmaker[Session]) -> None:
    from tierpoint.catalog.job.lookup import job_names

    names = [new_job() for _ in range(3)]
    with sessions.begin() as s:
        s.execute(insert(Job), [{"name": n} for n in names])
    with sessions() as s:
        first = job_names(s, limit=10_000)
        assert set(names) <= set(first)
        assert first == sorted(first)
        after = job_names(s, after=min(names), limit=10_000)
        assert min(names) not in after and set(names) - {min(names)} <= set(after)


async def test_workers_stopped_mid_expiry_then_the_same_run_finishes(
    settings: Settings, sessions: sessionmaker[Session], client: Client
) -> None:
    """The real workflow, stopped between begin and delete: only the shared worker runs, so the
    expiries begin (shared queue) and their deletions wait on node queues nobody serves; then the
    shared worker stops too. When all workers are back, the same run carries on and finishes."""
    job = new_job()
    policy_id = create_job(sessions, job, KEEP_ALL)
    async with running_workers(settings, client):
        for step in (1, 2):
            await write_checkpoint(settings, sessions, client, job, step)
        await settle(client, job)
    set_policy(sessions, policy_id, SSD_NONE)

    async with running_workers(settings, client, nodes=()):
        await request_retention(client, job, "test: policy changed")
        await wait_for(lambda: _ssd_states(sessions, job) == {1: "expiring", 2: "expiring"})
    # Nobody runs now. The bytes are still there, and no reader is sent to them.
    for node in NODES:
        assert steps_on_disk(settings.tier("ssd").root_for(node), job) == {1, 2}
        answer = await latest(settings, job, node=node)
        assert answer.step == 2
        assert {e.tier for e in answer.plan} & {"ssd"} == set()

    async with running_workers(settings, client):
        # No new request: the run that was interrupted completes its expiries.
        result = await settle(client, job, request=False)
    assert result.expired == 2 and result.failed == 0
    assert _ssd_states(sessions, job) == {1: "expired", 2: "expired"}
    for node in NODES:
        assert steps_on_disk(settings.tier("ssd").root_for(node), job) == set()
    assert (await latest(settings, job)).step == 2


def _ssd_states(sessions: sessionmaker[Session], job: str) -> dict[int, str]:
    return {step: st for (step, tier), st in markers(sessions, job).items() if tier == "ssd"}
