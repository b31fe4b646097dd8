"""The policy a job is under, on a real catalog: its own, else the default, else the built-in; a
stored policy that does not validate is refused."""

from __future__ import annotations

import uuid

import pytest
from pydantic import ValidationError
from sqlalchemy import update
from sqlalchemy.orm import Session

from tests.helpers.catalog_rows import job_row
from tierpoint.catalog.models import (
    RetentionPolicy,
)
from tierpoint.catalog.policy.assigned import policy_for_job
from tierpoint.retention import (
    DEFAULT_POLICY,
    Policy,
)


def test_policy_for_job_prefers_the_jobs_then_the_default_then_the_builtin(
    session: Session,
) -> None:
    session.execute(update(RetentionPolicy).values(is_default=False))
    job = job_row(session)
    assigned = policy_for_job(session, job.name)
    assert (assigned.source, assigned.policy_id, assigned.policy) == (
        "builtin",
        None,
        DEFAULT_POLICY,
    )

    default_spec = Policy.from_spec({"kinds": {"shared": {"keep_last": 9}}})
    default = RetentionPolicy(
        name=f"default-{uuid.uuid4().hex[:8]}", spec=default_spec.to_spec(), is_default=True
    )
    own_spec = Policy.from_spec({"tiers": {"s3": {"promote_every": 3, "keep_every": 6}}})
    own = RetentionPolicy(name=f"own-{uuid.uuid4().hex[:8]}", spec=own_spec.to_spec(), version=4)
    session.add_all([default, own])
    session.flush()
    assigned = policy_for_job(session, job.name)
    assert (assigned.source, assigned.policy_id, assigned.name, assigned.policy) == (
        "default",
        default.id,
        default.name,
        default_spec,
    )

    job.policy_id = own.id
    session.flush()
    assigned = policy_for_job(session, job.name)
    assert (assigned.source, assigned.policy_id, assigned.version, assigned.policy) == (
        "job",
        own.id,
        4,
        own_spec,
    )


def test_a_stored_policy_that_does_not_validate_is_refused(session: Session) -> None:
    bad = RetentionPolicy(
        name=f"bad-{uuid.uuid4().hex[:8]}", spec={"tiers": {"s3": {"keep_last": -1}}}
    )
    session.add(bad)
    session.flush()
    job = job_row(session, policy_id=bad.id)
    with pytest.raises(ValidationError):
        policy_for_job(session, job.name)
