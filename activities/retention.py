"""Retention activities: plan the job's expiries, begin a round's at once (tier copies -> expiring,
committed), and run each one on as delete the bytes (local tiers on their node's queue) -> finish
(-> expired).

Catalog and storage activities are sync (they run in the worker's thread pool); the ones that ask
Temporal for a retention run are async. Every one may run twice with the same outcome.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from pydantic import ValidationError
from temporalio import activity
from temporalio.client import Client
from temporalio.exceptions import ApplicationError

from tierpoint import logs
from tierpoint.catalog.checkpoint.shards import checkpoint_branch
from tierpoint.catalog.engine import Sessions
from tierpoint.catalog.job import lookup
from tierpoint.catalog.reads.checkpoint_views import checkpoint_refs
from tierpoint.catalog.reads.views import CheckpointRefView
from tierpoint.catalog.stripe import encoding as stripe_encoding
from tierpoint.catalog.stripe import pulling
from tierpoint.catalog.tier_copy import expiry as repo
from tierpoint.catalog.tier_copy import key_layouts, repair
from tierpoint.config import Settings
from tierpoint.contract import retention as c
from tierpoint.contract.common import FailureType
from tierpoint.contract.peer import RereplicateInput
from tierpoint.contract.retention import (
    BeginResult,
    BeginRoundInput,
    BeginRoundResult,
    BeginState,
    CopyRef,
    DeleteInput,
    ExpiryInput,
    FinishResult,
    JobNamesPage,
    ListJobsInput,
    RequestInput,
    RequestManyInput,
    RetentionPlanInput,
    RetentionPlanResult,
)
from tierpoint.errors import JobNotFound
from tierpoint.retention.policy import tier_refs
from tierpoint.states import TierState
from tierpoint.storage.base import LEFT_EXAMPLES, RecordedCopy
from tierpoint.storage.posix.staging import StripeStaging
from tierpoint.temporal import request_retention, start_peer_replan

from .registration import on_node_queue
from .stores import Stores, ensure_reachable

log = logs.get(__name__)


def _now() -> datetime:
    return datetime.now(UTC)


def _where(inp: DeleteInput) -> dict[str, object]:
    return {"job": inp.job, "step": inp.step, "tier": inp.tier, "node": inp.node}


def _policy_error(job: str, exc: ValidationError) -> ApplicationError:
    # Retention must not act on a policy it cannot read; retrying will not fix the document.
    return ApplicationError(
        f"the retention policy of job {job!r} does not validate: {exc}",
        type=FailureType.INVALID_POLICY,
        non_retryable=True,
    )


def _delete_staged(
    staging: StripeStaging,
    inp: DeleteInput,
    staged: dict[int, list[RecordedCopy]],
    branch: int,
) -> None:
    """A coded copy's stripes still staged on the shards' node go with the copy: each only
    while it holds the bytes the encoder recorded."""
    for index, copies in staged.items():
        done = staging.store(index).delete_checkpoint(inp.job, inp.step, copies, branch)
        if done.kept or done.left:
            log.warning(
                "staged stripes kept",
                **_where(inp),
                index=index,
                examples=[*done.kept, *done.left][:LEFT_EXAMPLES],
            )


class RetentionActivities:
    """Built once per worker. `node` is the node this worker serves (None: the shared worker);
    deleting a local copy is refused on any other worker. `client` is needed only by the
    activities that request retention runs."""

    def __init__(
        self,
        sessions: Sessions,
        settings: Settings,
        stores: Stores,
        client: Client | None = None,
        node: str | None = None,
    ) -> None:
        self._sessions = sessions
        self._settings = settings
        self._stores = stores
        self._client = client
        self._node = node

    # ---------------------------------------------------------------- plan

    @activity.defn(name=c.PLAN)
    def plan(self, inp: RetentionPlanInput) -> RetentionPlanResult:
        tiers = tier_refs(self._settings.tiers)
        try:
            with self._sessions.begin() as s:
                return repo.plan_expiries(s, inp.job, tiers, _now(), inp.limit)
        except JobNotFound:
            return RetentionPlanResult()
        except ValidationError as exc:
            raise _policy_error(inp.job, exc) from exc

    # ---------------------------------------------------------------- begin

    @activity.defn(name=c.BEGIN)
    def begin_expiry(self, inp: ExpiryInput) -> BeginResult:
        """One copy: what a run recorded before rounds began at once asks for."""
        copy = CopyRef(checkpoint_id=inp.checkpoint_id, tier=inp.tier)
        return self._begin(inp.job, [copy])[0]

    @activity.defn(name=c.BEGIN_ROUND)
    def begin_round(self, inp: BeginRoundInput) -> BeginRoundResult:
        return BeginRoundResult(results=self._begin(inp.job, inp.copies))

    def _begin(self, job: str, copies: list[CopyRef]) -> list[BeginResult]:
        tiers = tier_refs(self._settings.tiers)
        wanted = [(r.checkpoint_id, r.tier) for r in copies]
        try:
            with self._sessions.begin() as s:
                out = repo.begin_expiries(s, job, wanted, tiers, _now())
        except JobNotFound:
            gone = BeginResult(state=BeginState.SKIPPED, reason=f"job {job!r} is gone")
            return [gone] * len(wanted)
        except ValidationError as exc:
            raise _policy_error(job, exc) from exc
        for (checkpoint_id, tier), result in zip(wanted, out, strict=True):
            if result.state is BeginState.SKIPPED:
                log.info(
                    "expiry skipped",
                    job=job,
                    checkpoint_id=checkpoint_id,
                    tier=tier,
                    reason=result.reason,
                )
        return out

    # ---------------------------------------------------------------- delete

    @on_node_queue
    @activity.defn(name=c.DELETE)
    def delete_copy(self, inp: DeleteInput) -> None:
        tier = self._stores.tier(inp.tier)
        ensure_reachable(tier, inp.node, self._node)
        # The whole delete runs in one transaction that holds the copy's delete lock: its tier copy
        # cannot become `expired`, nor the step be registered again, before the bytes are gone.
        with self._sessions.begin() as s:
            state = repo.hold_for_delete(s, inp.checkpoint_id, inp.tier)
            if state == TierState.EXPIRED.value:
                # Finished after a delete that completed: this is a late attempt, and what is
                # at the copy's paths now may be a newer checkpoint's.
                log.info("copy already expired: nothing to delete", **_where(inp))
                return
            # Invariant 3, checked where the bytes go: only a copy no reader is sent to any more.
            # guard: delete-tier-copy-check
            if state != TierState.EXPIRING.value:
                raise ApplicationError(
                    f"refusing to delete checkpoint {inp.checkpoint_id} on {inp.tier}: its "
                    f"tier copy is {state or 'missing'}, not expiring",
                    type=FailureType.NOT_EXPIRING,
                    non_retryable=True,
                )
            copies = repo.registered_copies(s, inp.checkpoint_id, inp.tier, inp.node)
            if tier.stripe_code is not None and inp.node is not None:
                # A coded copy's bytes on a holder are the stripes it holds of others' shards.
                copies += pulling.held_copies(s, inp.checkpoint_id, tier.name, inp.node)
            branch = checkpoint_branch(s, inp.checkpoint_id)
            layout = key_layouts.on_tier(s, [inp.checkpoint_id], inp.tier).get(inp.checkpoint_id)
            store = self._stores.get(tier, inp.node, layout)
            # We delete only what we registered, and of it only the files the catalog verified:
            # never what else the job left in the directory, nor a file written at a shard's
            # path since (the job writing the step again): both are kept and reported.
            done = store.delete_checkpoint(inp.job, inp.step, copies, branch)
            if done.kept:
                repo.record_kept(s, inp.checkpoint_id, inp.tier, inp.node, done.kept)
            if tier.stripe_code is not None and inp.node is not None:
                staged = stripe_encoding.staged_copies(s, inp.checkpoint_id, tier.name, inp.node)
                _delete_staged(StripeStaging(tier, inp.node), inp, staged, branch)
        log.info("copy deleted", **_where(inp), shards=done.deleted)
        if done.kept:
            log.warning(
                "replaced since verified: kept",
                **_where(inp),
                shards=len(done.kept),
                examples=list(done.kept[:LEFT_EXAMPLES]),
            )
        if done.left:
            log.warning("unregistered files kept", **_where(inp), examples=list(done.left))

    # ---------------------------------------------------------------- finish

    @activity.defn(name=c.FINISH)
    async def finish_expiry(self, inp: ExpiryInput) -> FinishResult:
        state, remake = await asyncio.to_thread(self._finish, inp)
        # Asked on every attempt that finds the copy expired, so a retry after a start that
        # failed asks again; a run under way plans again instead of starting twice.
        # guard: expiry-replans-failed-peer-copies
        if remake is not None:
            await start_peer_replan(
                self._need_client(),
                RereplicateInput(checkpoint_id=remake.id, job=remake.job, step=remake.step),
                remake.branch,
            )
        return FinishResult(state=state)

    def _finish(self, inp: ExpiryInput) -> tuple[str, CheckpointRefView | None]:
        """The copy expired, and the checkpoint to re-replicate when it was a peer copy: a
        failed peer copy of the same checkpoint may have failed for want of a node not holding
        the shards' other copies, which this expiry just freed."""
        peers = [t.name for t in self._settings.peer_tiers()]
        with self._sessions.begin() as s:
            state = repo.finish_expiry(s, inp.checkpoint_id, inp.tier)
            if state != TierState.EXPIRED.value or inp.tier not in peers:
                return state, None
            if not repair.tiers_to_rereplicate(s, inp.checkpoint_id, peers):
                return state, None
            return state, checkpoint_refs(s, [inp.checkpoint_id]).get(inp.checkpoint_id)

    # ---------------------------------------------------------------- triggers

    def _need_client(self) -> Client:
        if self._client is None:
            raise ApplicationError("this worker has no Temporal client", non_retryable=True)
        return self._client

    @activity.defn(name=c.REQUEST)
    async def request(self, inp: RequestInput) -> None:
        # guard: request-activity-noop
        await request_retention(self._need_client(), inp.job, inp.reason)

    @activity.defn(name=c.REQUEST_MANY)
    async def request_many(self, inp: RequestManyInput) -> None:
        client = self._need_client()
        for n, job in enumerate(inp.jobs):
            await request_retention(client, job, inp.reason)
            activity.heartbeat(n)

    @activity.defn(name=c.LIST_JOBS)
    async def list_jobs(self, inp: ListJobsInput) -> JobNamesPage:
        def page() -> list[str]:
            with self._sessions.begin() as s:
                return lookup.job_names(s, after=inp.after, limit=inp.limit)

        jobs = await asyncio.to_thread(page)
        return JobNamesPage(jobs=jobs, next_after=jobs[-1] if len(jobs) == inp.limit else None)
