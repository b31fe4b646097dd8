"""Retention policies in the catalog, on a real catalog: created once per name, revised to a new
version only when the document changes, assigned to jobs (made on the spot when new), deleted
only when nothing uses them, and every change kept in the policy's history, newest first."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from tierpoint.catalog.models import Branch, Job
from tierpoint.catalog.policy.assigned import BUILTIN_POLICY_NAME
from tierpoint.catalog.policy.policies import (
    assign_policy,
    assigned_jobs,
    create_policy,
    delete_policy,
    get_policy,
    history,
    list_policies,
    update_policy,
)
from tierpoint.errors import PolicyExists, PolicyInUse, PolicyNotFound
from tierpoint.retention.policy import Policy

KEEP_1 = Policy.from_spec({"kinds": {"local": {"keep_last": 1}}})
KEEP_3 = Policy.from_spec({"kinds": {"local": {"keep_last": 3}}})


def _name(what: str) -> str:
    return f"{what}-{uuid.uuid4().hex[:8]}"


def test_a_policy_from_creation_to_deletion_with_its_history(session: Session) -> None:
    name, job = _name("policy"), _name("job")
    created = create_policy(session, name, KEEP_1, default=False, actor="alice")
    assert (created.version, created.default, created.jobs) == (1, False, 0)
    with pytest.raises(PolicyExists):
        create_policy(session, name, KEEP_3, default=False, actor="alice")
    with pytest.raises(PolicyExists, match="built-in"):
        create_policy(session, BUILTIN_POLICY_NAME, KEEP_3, default=False, actor="alice")

    same, changed = update_policy(session, name, KEEP_1, default=None, actor="bob")
    assert (same.version, changed) == (1, False)
    revised, changed = update_policy(session, name, KEEP_3, default=None, actor="bob")
    assert (revised.version, changed) == (2, True)
    assert revised.spec == KEEP_3.to_spec()

    # A job not seen yet is made, with its first branch, so a policy can precede training.
    assert assign_policy(session, job, name, actor="carol") == (None, name)
    job_id = session.scalar(select(Job.id).where(Job.name == job))
    assert session.get(Branch, (job_id, 1)) is not None
    assert assigned_jobs(session, name) == [job]
    assert get_policy(session, name).jobs == 1
    assert [p.jobs for p in list_policies(session) if p.name == name] == [1]
    with pytest.raises(PolicyInUse, match="assigned to 1 job") as in_use:
        delete_policy(session, name, actor="dave")
    assert in_use.value.extra == {"jobs": [job]}

    assert assign_policy(session, job, None, actor="carol") == (name, None)
    delete_policy(session, name, actor="dave")
    with pytest.raises(PolicyNotFound):
        get_policy(session, name)
    with pytest.raises(PolicyNotFound):
        assign_policy(session, job, name, actor="carol")

    changes = [(c.detail["action"], c.actor, c.detail["version"]) for c in history(session, name)]
    assert changes == [
        ("deleted", "dave", 2),
        ("assigned", "carol", None),
        ("assigned", "carol", 2),
        ("revised", "bob", 2),
        ("created", "alice", 1),
    ]


def test_the_default_policy_covers_jobs_without_one_and_cannot_be_deleted(
    session: Session,
) -> None:
    name, other, bare = _name("default"), _name("other"), _name("job")
    create_policy(session, name, KEEP_1, default=False, actor="alice")
    session.add(Job(name=bare))
    session.flush()
    assert bare not in assigned_jobs(session, name)

    made_default, changed = update_policy(session, name, KEEP_1, default=True, actor="alice")
    assert made_default.default and not changed
    assert bare in assigned_jobs(session, name)
    # The built-in policy is no longer what jobs without a policy run under.
    assert not get_policy(session, BUILTIN_POLICY_NAME).default
    with pytest.raises(PolicyInUse, match="is the default policy"):
        delete_policy(session, name, actor="alice")

    # A new default takes over: at most one default at a time.
    create_policy(session, other, KEEP_3, default=True, actor="alice")
    assert not get_policy(session, name).default
    delete_policy(session, name, actor="alice")
    actions = [c.detail["action"] for c in history(session, name)]
    assert actions == ["deleted", "default_unset", "default_set", "created"]
