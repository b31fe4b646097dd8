"""Which retention policy applies to a job: its own, else the catalog's default, else the
built-in one; read by retention, repair, the lifecycle's plan and the API."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict
from sqlalchemy import select
from sqlalchemy.orm import Session

from tierpoint.catalog.job.lookup import no_job
from tierpoint.catalog.models import Job, RetentionPolicy
from tierpoint.retention.policy import DEFAULT_POLICY, Policy


class AssignedPolicy(BaseModel):
    """The policy that applies to a job, and where it came from."""

    model_config = ConfigDict(frozen=True)

    source: Literal["job", "default", "builtin"]
    policy_id: int | None
    name: str
    version: int
    policy: Policy


BUILTIN_POLICY_NAME = "builtin-default"


def policy_for_job(session: Session, job: str) -> AssignedPolicy:
    """The job's own policy, else the catalog's default policy, else DEFAULT_POLICY.

    Raises JobNotFound, or pydantic.ValidationError if a stored spec does not validate (retention
    must not run on a policy it cannot read)."""
    row = session.execute(select(Job.id, Job.policy_id).where(Job.name == job)).one_or_none()
    if row is None:
        raise no_job(job)
    if row.policy_id is not None:
        pol = session.get_one(RetentionPolicy, row.policy_id)
        source: Literal["job", "default"] = "job"
    else:
        found = session.scalars(
            select(RetentionPolicy).where(RetentionPolicy.is_default)
        ).one_or_none()
        if found is None:
            return AssignedPolicy(
                source="builtin",
                policy_id=None,
                name=BUILTIN_POLICY_NAME,
                version=1,
                policy=DEFAULT_POLICY,
            )
        pol, source = found, "default"
    return AssignedPolicy(
        source=source,
        policy_id=pol.id,
        name=pol.name,
        version=pol.version,
        policy=Policy.from_spec(pol.spec),
    )
