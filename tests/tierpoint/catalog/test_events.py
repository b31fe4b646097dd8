"""The event history on a real catalog: every kind is stored as its name with what it was
recorded about, in order, and no detail given is an empty object, never null."""

from __future__ import annotations

import uuid

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from tierpoint.catalog.events import EventKind, record
from tierpoint.catalog.models import Event, Job


def test_every_kind_is_stored_with_what_it_was_recorded_about(session: Session) -> None:
    job_id = session.scalar(
        insert(Job).values(name=f"job-{uuid.uuid4().hex[:10]}").returning(Job.id)
    )
    for kind in EventKind:
        record(session, kind, job_id=job_id, tier="ssd", actor="ops", detail={"kind": kind.value})
    record(session, EventKind.ACKNOWLEDGED, job_id=job_id)
    rows = session.execute(
        select(Event.kind, Event.tier, Event.actor, Event.detail, Event.checkpoint_id)
        .where(Event.job_id == job_id)
        .order_by(Event.id)
    ).all()
    assert [tuple(r) for r in rows] == [
        *((k.value, "ssd", "ops", {"kind": k.value}, None) for k in EventKind),
        ("acknowledged", None, None, {}, None),
    ]
