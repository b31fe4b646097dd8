"""JobRetention: the one retention run of a job (id `retention/<job>`), and RetentionSweep, the
periodic workflow the `tierpoint.retention-sweep` schedule starts to request a run for every job.

JobRetention loops while requests are pending: requests that arrive during a pass set one flag, so
any number of them coalesce into one more pass. A pass plans (at most EXPIRIES_PER_ROUND expiries a
round), begins the round's expiries at once (one activity, one fresh plan under their row locks)
and runs each begun one as delete -> finish; it plans again after any round that
finished something (a quota may want more once bytes are gone) and stops at a round with nothing
to do or no progress (a deletion that keeps failing is left `expiring` for the next request). The
run ends when idle, or continues as new to keep its history bounded.

Deterministic: no I/O, no clocks; every catalog write and deletion happens in an activity.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from tierpoint.contract import retention as c
    from tierpoint.contract.common import (
        CATALOG_RETRY,
        CATALOG_TIMEOUT,
        SHARED_TASK_QUEUE,
        error_message,
        node_task_queue,
    )
    from tierpoint.contract.retention import (
        REQUEST_SIGNAL,
        RETENTION_WORKFLOW,
        SWEEP_REASON,
        SWEEP_WORKFLOW,
        BeginResult,
        BeginRoundInput,
        BeginRoundResult,
        BeginState,
        CopyRef,
        DeleteInput,
        ExpiryInput,
        ExpiryTask,
        FinishResult,
        JobNamesPage,
        ListJobsInput,
        RequestManyInput,
        RetentionInput,
        RetentionPlanInput,
        RetentionPlanResult,
        RetentionRequest,
        RetentionResult,
        RetentionStatus,
        SweepResult,
    )
    from tierpoint.tier_config import TierKind

# Expiries deleting and finishing at once within a round (each finish locks its own checkpoint row).
EXPIRY_WINDOW = 8
# Reasons kept for the status query.
REASONS_KEPT = 10
# Runs from before it begin each copy of a round on its own, planning the whole job each time.
BEGIN_ROUND_PATCH = "retention-begins-a-round-at-once"


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
            rounds += await self._pass(inp.job, inp.rounds_per_run)
            self._status.passes += 1
            if self._requested and (
                rounds >= inp.rounds_per_run or workflow.info().is_continue_as_new_suggested()
            ):
                workflow.continue_as_new(
                    RetentionInput(
                        job=inp.job,
                        pending=True,
                        passes_before=self._status.passes,
                        rounds_per_run=inp.rounds_per_run,
                    )
                )
        return RetentionResult(
            job=inp.job,
            passes=self._status.passes,
            expired=self._status.expired,
            skipped=self._status.skipped,
            failed=self._status.failed,
        )

    async def _pass(self, job: str, rounds_per_run: int) -> int:
        """One retention pass; returns how many rounds it took."""
        rounds = 0
        window = asyncio.Semaphore(EXPIRY_WINDOW)
        while True:
            rounds += 1
            try:
                batch: RetentionPlanResult = await workflow.execute_activity(
                    c.PLAN,
                    RetentionPlanInput(job=job),
                    result_type=RetentionPlanResult,
                    task_queue=SHARED_TASK_QUEUE,
                    start_to_close_timeout=CATALOG_TIMEOUT,
                    retry_policy=CATALOG_RETRY,
                )
            except ActivityError as err:
                # A policy that does not validate: nothing expires until it is fixed.
                self._status.last_failure = f"plan: {error_message(err)}"
                return rounds
            self._status.policy = batch.policy
            if not batch.tasks:
                return rounds
            done = await self._round(window, job, batch.tasks)
            if not any(done) or rounds >= rounds_per_run:
                if rounds >= rounds_per_run and any(done):
                    self._requested = True  # more to do: the run continues (as new) with it
                return rounds

    async def _round(
        self, window: asyncio.Semaphore, job: str, tasks: list[ExpiryTask]
    ) -> list[bool]:
        """The round's expiries; True for each that ended `expired`. Their copies are begun at
        once, under one fresh plan (the job planned once a round, not once a copy); a run
        recorded before that begins each copy on its own."""
        if not workflow.patched(BEGIN_ROUND_PATCH):
            return await asyncio.gather(*(self._windowed(window, job, t, None) for t in tasks))
        copies = [CopyRef(checkpoint_id=t.checkpoint_id, tier=t.tier) for t in tasks]
        # guard: workflow-delete-before-begin
        try:
            begun: BeginRoundResult = await workflow.execute_activity(
                c.BEGIN_ROUND,
                BeginRoundInput(job=job, copies=copies),
                result_type=BeginRoundResult,
                task_queue=SHARED_TASK_QUEUE,
                start_to_close_timeout=CATALOG_TIMEOUT,
                retry_policy=CATALOG_RETRY,
            )
        except ActivityError as err:
            # Nothing began (one transaction): the copies stay as they are for the next run.
            self._status.failed += len(tasks)
            self._status.last_failure = f"begin: {error_message(err)}"
            return [False] * len(tasks)
        return await asyncio.gather(
            *(self._windowed(window, job, t, b) for t, b in zip(tasks, begun.results, strict=True))
        )

    async def _windowed(
        self, window: asyncio.Semaphore, job: str, task: ExpiryTask, begun: BeginResult | None
    ) -> bool:
        async with window:
            return await self._expire(job, task, begun)

    async def _begin(self, ref: ExpiryInput) -> BeginResult:
        begun: BeginResult = await workflow.execute_activity(
            c.BEGIN,
            ref,
            result_type=BeginResult,
            task_queue=SHARED_TASK_QUEUE,
            start_to_close_timeout=CATALOG_TIMEOUT,
            retry_policy=CATALOG_RETRY,
        )
        return begun

    async def _expire(self, job: str, task: ExpiryTask, begun: BeginResult | None) -> bool:
        """begin (unless the round began it) -> delete -> finish for one copy; True when it
        ended `expired`."""
        ref = ExpiryInput(job=job, checkpoint_id=task.checkpoint_id, tier=task.tier)
        try:
            if begun is None:
                begun = await self._begin(ref)
            if begun.state is BeginState.SKIPPED:
                self._status.skipped += 1
                self._status.last_skip = f"step {task.step} on {task.tier}: {begun.reason}"
                # guard: workflow-delete-whatever-begin-said
                return False
            if begun.state is BeginState.EXPIRING:
                await self._delete(job, task)
            finished: FinishResult = await workflow.execute_activity(
                c.FINISH,
                ref,
                result_type=FinishResult,
                task_queue=SHARED_TASK_QUEUE,
                start_to_close_timeout=CATALOG_TIMEOUT,
                retry_policy=CATALOG_RETRY,
            )
        except ActivityError as err:
            # The tier copy stays `expiring` (no reader is sent there); a later run finishes it.
            self._status.failed += 1
            self._status.last_failure = f"step {task.step} on {task.tier}: {error_message(err)}"
            return False
        if finished.state == "expired":
            self._status.expired += 1
            return True
        return False

    async def _delete(self, job: str, task: ExpiryTask) -> None:
        async def delete(node: str | None, queue: str) -> None:
            await workflow.execute_activity(
                c.DELETE,
                DeleteInput(
                    job=job,
                    checkpoint_id=task.checkpoint_id,
                    step=task.step,
                    tier=task.tier,
                    node=node,
                ),
                task_queue=queue,
                start_to_close_timeout=c.DELETE_TIMEOUT,
                schedule_to_close_timeout=c.DELETE_DEADLINE,
                retry_policy=c.DELETE_RETRY,
            )

        if task.kind in (TierKind.LOCAL, TierKind.PEER):
            # Every node that may hold part of the copy, at once.
            await asyncio.gather(*(delete(n, node_task_queue(n)) for n in task.nodes))
        else:
            await delete(None, SHARED_TASK_QUEUE)


@workflow.defn(name=SWEEP_WORKFLOW)
class RetentionSweep:
    """Requests a retention run for every job, a page at a time (time-based rules such as
    keep_within and keep_every intervals change their answer without any promotion)."""

    @workflow.run
    async def run(self) -> SweepResult:
        after: str | None = None
        total = 0
        while True:
            page: JobNamesPage = await workflow.execute_activity(
                c.LIST_JOBS,
                ListJobsInput(after=after),
                result_type=JobNamesPage,
                task_queue=SHARED_TASK_QUEUE,
                start_to_close_timeout=CATALOG_TIMEOUT,
                retry_policy=CATALOG_RETRY,
            )
            if page.jobs:
                await workflow.execute_activity(
                    c.REQUEST_MANY,
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
