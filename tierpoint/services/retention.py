"""Retention, as the API and the CLI's server side use it: reading a policy document, resolving
the policy a job runs under, the dry run, and asking for retention runs after a change."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from temporalio.client import Client

from tierpoint import logs
from tierpoint.catalog.engine import AsyncSession, Session, catalog_now
from tierpoint.catalog.policy.assigned import AssignedPolicy, policy_for_job
from tierpoint.catalog.policy.snapshot import dry_run, take_snapshot
from tierpoint.errors import InvalidPolicy, UnknownTier
from tierpoint.retention import Policy, RetentionPlan, TierRef, check_tiers, plan
from tierpoint.temporal import request_retention

log = logs.get(__name__)

# A retention request that takes longer than this is dropped (the periodic sweep catches up).
REQUEST_TIMEOUT = 5.0


def _field_error(loc: Sequence[Any], msg: str, code: str) -> dict[str, Any]:
    field = ""
    for p in loc:
        field += f"[{p}]" if isinstance(p, int) else (f".{p}" if field else str(p))
    # A policy document is always in the request body.
    return {
        "loc": list(loc),
        "msg": msg,
        "field": field,
        "location": "body",
        "message": msg,
        "code": code,
    }


def parse_policy(spec: object, tiers: Sequence[TierRef], prefix: Sequence[str]) -> Policy:
    """The document as a Policy that fits the configured tiers, else InvalidPolicy (a bad
    document) or UnknownTier (rules of tiers not configured), naming the fields under `prefix`."""
    try:
        policy = Policy.from_spec(spec)
    except ValidationError as exc:
        errors = [
            _field_error([*prefix, *e["loc"]], e["msg"], e["type"])
            for e in exc.errors(include_url=False)
        ]
        first = errors[0]
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise InvalidPolicy(f"{first['field']}: {first['msg']}{more}", errors=errors) from None
    problems = check_tiers(policy, tiers)
    if problems:
        names = ", ".join(t.name for t in tiers)
        unknown = [p for p in problems if len(p.loc) == 2 and p.loc[0] == "tiers"]
        errors = [
            _field_error(
                [*prefix, *p.loc], p.msg, "unknown_tier" if p in unknown else "invalid_policy"
            )
            for p in problems
        ]
        detail = f"{errors[0]['field']}: {errors[0]['msg']}; tiers are {names}"
        if unknown:
            raise UnknownTier(detail, errors=errors)
        raise InvalidPolicy(detail, errors=errors)
    return policy


async def resolve_policy(session: AsyncSession, job: str) -> AssignedPolicy:
    """The policy `job` runs under and where it comes from (raises JobNotFound)."""
    return await session.run_sync(policy_for_job, job)


@dataclass(frozen=True)
class Evaluation:
    assigned: AssignedPolicy  # the policy the job runs under
    plan: RetentionPlan  # under `preview` when one was given, else under `assigned`
    # With a preview: the plan under the job's own policy, on the same snapshot, so that the two
    # can be compared (what the preview would save or cost).
    baseline: RetentionPlan | None


def _evaluate(
    session: Session, job: str, tiers: Sequence[TierRef], preview: Policy | None
) -> Evaluation:
    now = catalog_now(session)
    if preview is None:
        assigned, current = dry_run(session, job, tiers, now)
        return Evaluation(assigned, current, None)
    snapshot = take_snapshot(session, job, tiers, now)
    assigned = policy_for_job(session, job)
    return Evaluation(assigned, plan(snapshot, preview, now), plan(snapshot, assigned.policy, now))


async def evaluate(
    session: AsyncSession, job: str, tiers: Sequence[TierRef], preview: Policy | None = None
) -> Evaluation:
    """The dry run (under the job's policy, or `preview` instead) on one consistent snapshot
    (REPEATABLE READ), at the database's clock, the clock leases are written with. Changes
    nothing. Raises JobNotFound."""
    await session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
    try:
        return await session.run_sync(_evaluate, job, tiers, preview)
    finally:
        await session.rollback()


async def request_retention_runs(client: Client | None, jobs: Sequence[str], reason: str) -> None:
    """Best effort, after a committed change: ask for a retention run of each job. Failures are
    logged, never raised: the periodic sweep runs retention anyway."""
    if not jobs:
        return
    if client is None:
        log.warning("retention not requested: temporal unreachable", jobs=len(jobs), reason=reason)
        return
    for job in jobs:
        try:
            await asyncio.wait_for(request_retention(client, job, reason), REQUEST_TIMEOUT)
        except Exception as exc:
            log.warning("retention not requested", job=job, reason=reason, error=repr(exc))
