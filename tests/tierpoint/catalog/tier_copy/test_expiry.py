"""Retention's expiries in the catalog, on a real catalog: the plan of what to expire now, an
expiry begun only when a fresh plan under the row locks still wants the copy gone (a pin taken
since keeps it; a round's copies begun together, each under the one plan made once their rows
are locked), continued and never turned back once begun, the copy's registered files named
for the delete with their identities, and the finish that makes replicas and tier copy
`expired` with the rule the expiry began with."""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from sqlalchemy import Engine, event, select, update
from sqlalchemy.orm import Session

from tests.helpers.expiry_races import WAIT_LIMIT, lock_waiters
from tierpoint.catalog.checkpoint.registration import register_checkpoint
from tierpoint.catalog.engine import catalog_now
from tierpoint.catalog.events import EventKind
from tierpoint.catalog.holds import pins
from tierpoint.catalog.models import Checkpoint, Event, Replica, Shard
from tierpoint.catalog.node.registry import upsert_node
from tierpoint.catalog.policy.policies import assign_policy, create_policy
from tierpoint.catalog.replica.machine import ReplicaWrite, upsert_replicas
from tierpoint.catalog.tier_copy.expiry import (
    begin_expiries,
    begin_expiry,
    finish_expiry,
    hold_for_delete,
    plan_expiries,
    record_kept,
    registered_copies,
)
from tierpoint.catalog.tier_copy.promotion import promote
from tierpoint.contract.retention import BeginResult, BeginState
from tierpoint.manifest import Manifest, ShardSpec
from tierpoint.retention.policy import Policy, TierRef
from tierpoint.states import ReplicaState
from tierpoint.tier_config import TierKind

TIERS = [TierRef("ssd", TierKind.LOCAL), TierRef("lustre", TierKind.SHARED)]


def _job(session: Session) -> tuple[str, str]:
    """A job whose policy keeps the newest local copy only, and its node."""
    job, node = f"expiry-{uuid.uuid4().hex[:8]}", f"node-{uuid.uuid4().hex[:8]}"
    upsert_node(session, node, {})
    create_policy(
        session,
        job,
        Policy.from_spec({"kinds": {"local": {"keep_last": 1}}}),
        default=False,
        actor="test",
    )
    assign_policy(session, job, job, actor="test")
    return job, node


def _restorable(session: Session, job: str, node: str, step: int) -> int:
    """A checkpoint of one shard on `node`, restorable on ssd and on lustre."""
    shard = ShardSpec(path="model.bin", size=10, crc32c="0badf00d", node=node)
    cp = register_checkpoint(session, job, Manifest(step=step, shards=[shard]), ["ssd", "lustre"])
    sid = session.scalar(select(Shard.id).where(Shard.checkpoint_id == cp.checkpoint_id))
    assert sid is not None
    verified = ReplicaState.VERIFIED
    for tier, at in (("ssd", node), ("lustre", None)):
        write = ReplicaWrite(sid, verified, f"/{tier}/{step}", at, 10, identity=f"{tier}-{step}")
        upsert_replicas(session, cp.checkpoint_id, tier, [write])
    assert promote(session, cp.checkpoint_id, "ssd", ["lustre"], None).state == "restorable"
    assert promote(session, cp.checkpoint_id, "lustre", [], None).state == "restorable"
    return cp.checkpoint_id


def _replica_states(session: Session, cp: int) -> list[str]:
    return list(
        session.scalars(
            select(Replica.state).where(Replica.checkpoint_id == cp).order_by(Replica.tier)
        )
    )


def test_an_expiry_is_planned_begun_under_a_fresh_plan_and_finished(session: Session) -> None:
    job, node = _job(session)
    one = _restorable(session, job, node, 1)
    _restorable(session, job, node, 2)
    now = catalog_now(session)

    planned = plan_expiries(session, job, TIERS, now, limit=10)
    assert [(t.checkpoint_id, t.tier, t.rule, t.nodes) for t in planned.tasks] == [
        (one, "ssd", "not_kept", [node])
    ]
    assert not planned.more and planned.policy.startswith(f"{job} v1")

    # A pin taken after the plan wins: the expiry does not begin.
    session.execute(update(Checkpoint).where(Checkpoint.id == one).values(pinned=True))
    kept = begin_expiry(session, job, one, "ssd", TIERS, now)
    assert kept.state is BeginState.SKIPPED and "kept now" in (kept.reason or "")
    session.execute(update(Checkpoint).where(Checkpoint.id == one).values(pinned=False))

    begun = begin_expiry(session, job, one, "ssd", TIERS, now)
    assert (begun.state, begun.rule) == (BeginState.EXPIRING, "not_kept")
    assert _replica_states(session, one) == ["verified", "expiring"]  # lustre, ssd
    # Begun is continued, never turned back, whatever the plan says now.
    again = begin_expiry(session, job, one, "ssd", TIERS, now)
    assert (again.state, again.rule) == (BeginState.EXPIRING, "not_kept")
    assert plan_expiries(session, job, TIERS, now, limit=10).tasks[0].checkpoint_id == one

    assert hold_for_delete(session, one, "ssd") == "expiring"
    (copy,) = registered_copies(session, one, "ssd", node)
    assert (copy.path, copy.size, copy.crc32c, copy.identity) == (
        "model.bin",
        10,
        "0badf00d",
        "ssd-1",
    )
    # Another node's delete of this copy may remove nothing of it.
    assert registered_copies(session, one, "ssd", f"{node}-other") == []
    record_kept(session, one, "ssd", node, ["model.bin"])

    assert finish_expiry(session, one, "ssd") == "expired"
    assert _replica_states(session, one) == ["verified", "expired"]
    assert finish_expiry(session, one, "ssd") == "expired"  # nothing left to do
    assert begin_expiry(session, job, one, "ssd", TIERS, now).state is BeginState.EXPIRED
    events = session.execute(
        select(Event.kind, Event.detail).where(Event.checkpoint_id == one).order_by(Event.id)
    ).all()
    kinds = [e.kind for e in events]
    assert kinds[-3:] == [EventKind.EXPIRING, EventKind.KEPT, EventKind.EXPIRED]
    assert events[-1].detail == {"rule": "not_kept"}


def test_a_rounds_expiries_begin_together_under_one_fresh_plan(session: Session) -> None:
    """A round's copies are begun at once, each judged by the one plan made under their locks:
    a pin taken after the round was planned keeps its copy, the others begin, a copy begun
    earlier is continued, and each answer stands where its copy was asked."""
    job, node = _job(session)
    one, two, three = (_restorable(session, job, node, step) for step in (1, 2, 3))
    _restorable(session, job, node, 4)
    now = catalog_now(session)
    planned = plan_expiries(session, job, TIERS, now, limit=10)
    assert [(t.checkpoint_id, t.tier) for t in planned.tasks] == [
        (one, "ssd"),
        (two, "ssd"),
        (three, "ssd"),
    ]
    assert begin_expiry(session, job, one, "ssd", TIERS, now).state is BeginState.EXPIRING
    session.execute(update(Checkpoint).where(Checkpoint.id == two).values(pinned=True))

    asked = [(three, "ssd"), (two, "ssd"), (one, "ssd"), (-1, "ssd"), (three, "lustre")]
    results = begin_expiries(session, job, asked, TIERS, now)
    assert [(r.state, r.rule) for r in results] == [
        (BeginState.EXPIRING, "not_kept"),
        (BeginState.SKIPPED, None),
        (BeginState.EXPIRING, "not_kept"),
        (BeginState.SKIPPED, None),
        (BeginState.SKIPPED, None),
    ]
    assert "kept now" in (results[1].reason or "") and "pinned" in (results[1].reason or "")
    assert "is gone" in (results[3].reason or "")
    assert _replica_states(session, two) == ["verified", "verified"]
    assert _replica_states(session, three) == ["verified", "expiring"]
    expiring = session.scalars(
        select(Event.checkpoint_id).where(
            Event.kind == EventKind.EXPIRING, Event.checkpoint_id.in_([one, two, three])
        )
    ).all()
    assert sorted(c for c in expiring if c is not None) == [one, three]


def _begin_round(catalog: Engine, job: str, copies: list[tuple[int, str]]) -> list[BeginResult]:
    with Session(catalog) as s, s.begin():
        return begin_expiries(s, job, copies, TIERS, catalog_now(s))


def test_a_pin_committed_while_a_round_waits_keeps_its_copy_and_the_rest_begin(
    catalog_engine: Engine,
) -> None:
    """The round's begin locks every checkpoint of the round before it plans: a pin in flight on
    one of them (the API's own catalog function, its transaction holding the row) makes the round
    wait, and once the pin commits the round's one plan sees it, keeps that copy and begins the
    others."""
    with Session(catalog_engine) as s, s.begin():
        job, node = _job(s)
        one, two, three = (_restorable(s, job, node, step) for step in (1, 2, 3))
        _restorable(s, job, node, 4)
    copies = [(one, "ssd"), (two, "ssd"), (three, "ssd")]
    with ThreadPoolExecutor(1) as pool:
        with Session(catalog_engine) as pinning, pinning.begin():
            assert pins.set_pinned(pinning, job, 2, True, actor="test").changed
            round_ = pool.submit(_begin_round, catalog_engine, job, copies)
            deadline = time.monotonic() + WAIT_LIMIT  # a bound on a hang, not an assertion
            while not lock_waiters(catalog_engine) and not round_.done():
                assert time.monotonic() < deadline, "the round neither waited nor finished"
                time.sleep(0.05)
            assert not round_.done(), f"the round did not wait for the pin: {round_.result()}"
        results = round_.result(timeout=WAIT_LIMIT)
    assert [r.state for r in results] == [
        BeginState.EXPIRING,
        BeginState.SKIPPED,
        BeginState.EXPIRING,
    ]
    assert "pinned" in (results[1].reason or "")
    with Session(catalog_engine) as s:
        assert _replica_states(s, two) == ["verified", "verified"]
        assert _replica_states(s, one) == _replica_states(s, three) == ["verified", "expiring"]


def test_a_rounds_begin_reads_the_whole_job_once_however_many_copies(
    catalog_engine: Engine,
) -> None:
    """The cost the round exists for, counted rather than timed: the job's snapshot (its one
    statement that reads the leases) runs once for the round's five copies, not once a copy."""
    with Session(catalog_engine) as s, s.begin():
        job, node = _job(s)
        ids = [_restorable(s, job, node, step) for step in range(1, 7)]
    statements: list[str] = []

    def seen(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        statements.append(statement)

    event.listen(catalog_engine, "before_cursor_execute", seen)
    try:
        results = _begin_round(catalog_engine, job, [(cid, "ssd") for cid in ids[:5]])
    finally:
        event.remove(catalog_engine, "before_cursor_execute", seen)
    assert [r.state for r in results] == [BeginState.EXPIRING] * 5
    assert sum("restore_lease" in st for st in statements) == 1, statements


def test_an_expiry_of_a_copy_that_is_not_restorable_never_begins(session: Session) -> None:
    job, node = _job(session)
    one = _restorable(session, job, node, 1)
    now = catalog_now(session)
    # The newest checkpoint is kept: nothing to expire.
    assert plan_expiries(session, job, TIERS, now, limit=10).tasks == []
    kept = begin_expiry(session, job, one, "ssd", TIERS, now)
    assert kept.state is BeginState.SKIPPED
    missing = begin_expiry(session, job, one, "s3", TIERS, now)
    assert missing.state is BeginState.SKIPPED
    assert missing.reason == "the tier copy on 's3' is missing"
    gone = begin_expiry(session, job, -1, "ssd", TIERS, now)
    assert gone.state is BeginState.SKIPPED and "is gone" in (gone.reason or "")
    assert finish_expiry(session, one, "ssd") == "restorable"
    assert _replica_states(session, one) == ["verified", "verified"]
