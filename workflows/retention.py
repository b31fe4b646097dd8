"""JobRetention: the one retention run of a job (id `retention/<job>`), and RetentionSweep, the
periodic workflow the `tierpoint.retention-sweep` schedule starts to request a run for every job.

JobRetention loops while requests are pending: requests that arrive during a pass set one flag, so
any number of them coalesce into one more pass. A pass plans (at most EXPIRIES_PER_ROUND expiries a
round) and runs each expiry as begin -> delete -> finish; it plans again after any round that
finished something (a quota may want more once bytes are gone) and stops at a round with nothing
to do or no progress (a deletion that keeps failing is left `expiring` for the next request). The
run ends when idle, or continues as new to keep its history bounded.

Deterministic: no I/O, no clocks; every catalog write and deletion happens in an activity.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from pydantic import BaseModel, Field
from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from activities.schemas import (
        RETENTION_BEGIN,
        RETENTION_DELETE,
        RETENTION_FINISH,
        RETENTION_LIST_JOBS,
        RETENTION_PLAN,
        RETENTION_REQUEST_MANY,
        BeginResult,
        DeleteInput,
        ExpiryInput,
        ExpiryTask,
        FinishResult,
        JobPage,
        ListJobsInput,
        RequestManyInput,
        RetentionPlanInput,
        RetentionPlanResult,
    )
    from tierpoint.config import SHARED_TASK_QUEUE, TierKind, node_task_queue
    from tierpoint.retention.trigger import (
        REQUEST_SIGNAL,
        RETENTION_WORKFLOW,
        SWEEP_WORKFLOW,
        RetentionInput,
        RetentionRequest,
    )

CATALOG_TIMEOUT = timedelta(minutes=2)
CATALOG_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(minutes=1),
    non_retryable_error_types=["InvalidPolicy"],
)
# Deleting a checkpoint's directory or S3 prefix. A node that stays away longer than
# DELETE_DEADLINE leaves the copy `expiring` (never restorable again) for a later run.
DELETE_TIMEOUT = timedelta(minutes=30)
DELETE_DEADLINE = timedelta(hours=1)
DELETE_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(minutes=1),
    non_retryable_error_types=["WrongNode", "NotExpiring"],
)
# Expiries in flight at once within a round (each locks its own checkpoint row).
EXPIRY_WINDOW = 8
# Rounds (plan + its expiries) per run before continuing as new.
ROUNDS_PER_RUN = 20
# Reasons kept for the status query.
REASONS_KEPT = 10


class RetentionStatus(BaseModel):
    job: str
    passes: int = 0  # passes finished, this run and the runs it continued from
    requests: int = 0  # requests received by this run
    expired: int = 0  # expiries finished by this run
    skipped: int = 0  # expiries the re-check refused in this run
    failed: int = 0  # expiries left `expiring` by this run (deletion failed)
    last_reasons: list[str] = Field(default_factory=list)
    last_skip: str | None = None
    last_failure: str | None = None
    policy: str = ""


class RetentionResult(BaseModel):
    job: str
    passes: int
    expired: int
    skipped: int
    failed: int


def _message(err: BaseException) -> str:
    cause = err.__cause__ if isinstance(err, ActivityError) and err.__cause__ else err
    return str(cause) or type(cause).__name__


@workflow.defn(name=RETENTION_WORKFLOW)
class JobRetention:
    def __init__(self) -> None:
        self._requested = False
        self._status = RetentionStatus(job="")

    @workflow.signal(name=REQUEST_SIGNAL)
    def request(self, req: RetentionRequest) -> None:
        self._requested = True
        self._status.requests += 1
        self._status.last_reasons = [*self._status.last_reasons, req.reason][-REASONS_KEPT:]

    @workflow.query
    def status(self) -> RetentionStatus:
        return self._status

    @workflow.run
    async def run(self, inp: RetentionInput) -> RetentionResult:
        self._status.job = inp.job
        self._status.passes = inp.passes_before
        self._requested = self._requested or inp.pending
        rounds = 0
        while self._requested:
            self._requested = False
            rounds += await self._pass(inp.job)
            self._status.passes += 1
            if self._requested and (
                rounds >= ROUNDS_PER_RUN or workflow.info().is_continue_as_new_suggested()
            ):
                workflow.continue_as_new(
                    RetentionInput(job=inp.job, pending=True, passes_before=self._status.passes)
                )
        return RetentionResult(
            job=inp.job,
            passes=self._status.passes,
            expired=self._status.expired,
            skipped=self._status.skipped,
            failed=self._status.failed,
        )

    async def _pass(self, job: str) -> int:
        """One retention pass; returns how many rounds it took."""
        rounds = 0
        window = asyncio.Semaphore(EXPIRY_WINDOW)
        while True:
            rounds += 1
            try:
                batch: RetentionPlanResult = await workflow.execute_activity(
                    RETENTION_PLAN,
                    RetentionPlanInput(job=job),
                    result_type=RetentionPlanResult,
                    task_queue=SHARED_TASK_QUEUE,
                    start_to_close_timeout=CATALOG_TIMEOUT,
                    retry_policy=CATALOG_RETRY,
                )
            except ActivityError as err:
                # A policy that does not validate: nothing expires until it is fixed.
                self._status.last_failure = f"plan: {_message(err)}"
                return rounds
            self._status.policy = batch.policy
            if not batch.tasks:
                return rounds
            done = await asyncio.gather(*(self._windowed(window, job, t) for t in batch.tasks))
            if not any(done) or rounds >= ROUNDS_PER_RUN:
                if rounds >= ROUNDS_PER_RUN and any(done):
                    self._requested = True  # more to do: the run continues (as new) with it
                return rounds

    async def _windowed(self, window: asyncio.Semaphore, job: str, task: ExpiryTask) -> bool:
        async with window:
            return await self._expire(job, task)

    async def _expire(self, job: str, task: ExpiryTask) -> bool:
        """begin -> delete -> finish for one copy; True when it ended `expired`."""
        ref = ExpiryInput(job=job, checkpoint_id=task.checkpoint_id, tier=task.tier)
        try:
            begun: BeginResult = await workflow.execute_activity(
                RETENTION_BEGIN,
                ref,
                result_type=BeginResult,
                task_queue=SHARED_TASK_QUEUE,
                start_to_close_timeout=CATALOG_TIMEOUT,
                retry_policy=CATALOG_RETRY,
            )
            if begun.state == "skipped":
                self._status.skipped += 1
                self._status.last_skip = f"step {task.step} on {task.tier}: {begun.reason}"
                return False
            if begun.state == "expiring":
                await self._delete(job, task)
            finished: FinishResult = await workflow.execute_activity(
                RETENTION_FINISH,
                ref,
                result_type=FinishResult,
                task_queue=SHARED_TASK_QUEUE,
                start_to_close_timeout=CATALOG_TIMEOUT,
                retry_policy=CATALOG_RETRY,
            )
        except ActivityError as err:
            # The marker stays `expiring` (no reader is sent there); a later run finishes it.
            self._status.failed += 1
            self._status.last_failure = f"step {task.step} on {task.tier}: {_message(err)}"
            return False
        if finished.state == "expired":
            self._status.expired += 1
            return True
        return False

    async def _delete(self, job: str, task: ExpiryTask) -> None:
        async def delete(node: str | None, queue: str) -> None:
            await workflow.execute_activity(
                RETENTION_DELETE,
                DeleteInput(
                    job=job,
                    checkpoint_id=task.checkpoint_id,
                    step=task.step,
                    tier=task.tier,
                    node=node,
                ),
                task_queue=queue,
                start_to_close_timeout=DELETE_TIMEOUT,
                schedule_to_close_timeout=DELETE_DEADLINE,
                retry_policy=DELETE_RETRY,
            )

        if task.kind is TierKind.LOCAL:
            # Every node that may hold part of the copy, at once.
            await asyncio.gather(*(delete(n, node_task_queue(n)) for n in task.nodes))
        else:
            await delete(None, SHARED_TASK_QUEUE)


SWEEP_REASON = "periodic sweep"


class SweepResult(BaseModel):
    jobs: int


@workflow.defn(name=SWEEP_WORKFLOW)
class RetentionSweep:
    """Requests a retention run for every job, a page at a time (time-based rules such as
    keep_within and keep_every intervals change their answer without any promotion)."""

    @workflow.run
    async def run(self) -> SweepResult:
        after: str | None = None
        total = 0
        while True:
            page: JobPage = await workflow.execute_activity(
                RETENTION_LIST_JOBS,
                ListJobsInput(after=after),
                result_type=JobPage,
                task_queue=SHARED_TASK_QUEUE,
                start_to_close_timeout=CATALOG_TIMEOUT,
                retry_policy=CATALOG_RETRY,
            )
            if page.jobs:
                await workflow.execute_activity(
                    RETENTION_REQUEST_MANY,
                    RequestManyInput(jobs=page.jobs, reason=SWEEP_REASON),
                    task_queue=SHARED_TASK_QUEUE,
                    start_to_close_timeout=timedelta(minutes=10),
                    heartbeat_timeout=timedelta(minutes=1),
                    retry_policy=CATALOG_RETRY,
                )
                total += len(page.jobs)
            if page.next_after is None:
                return SweepResult(jobs=total)
            after = page.next_after
