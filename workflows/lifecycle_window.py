"""A lifecycle stage's batches: one activity per batch on the queue that can reach its tiers,
through a sliding window of `tier.parallelism` (per node on the nodes' queues, when the stage
says so), and the nodes declared lost meanwhile, whose batches are given up."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from tierpoint.contract.common import (
        SHARED_TASK_QUEUE,
        error_message,
        node_task_queue,
    )
    from tierpoint.contract.lifecycle import (
        BATCH_RETRY,
        BATCH_TIMEOUT,
        COPY_BATCH,
        SEAL_BATCH,
        Batch,
        BatchResult,
        CopyInput,
        LifecyclePlan,
        LifecycleStatus,
        PlanTier,
        SealInput,
        StageInput,
        StageResult,
        StripePhase,
    )
    from tierpoint.contract.stripes import (
        ENCODE_BATCH,
        PULL_BATCH,
        REBUILD_BATCH,
        UNSTAGE_BATCH,
        EncodeInput,
        PullInput,
        RebuildInput,
    )
    from tierpoint.tier_config import TierKind


def on_nodes_queues(*tiers: PlanTier | None) -> bool:
    """Work touching a local or peer tier runs on the batches' nodes' queues (a peer copy on its
    holder's); the rest on the shared queue."""
    return any(t is not None and t.kind in (TierKind.LOCAL, TierKind.PEER) for t in tiers)


def _batch_queue(batch: Batch, *tiers: PlanTier) -> str:
    return node_task_queue(batch.runs_on) if on_nodes_queues(*tiers) else SHARED_TASK_QUEUE


def _nodes_of(batch: Batch) -> list[str]:
    """The nodes a batch needs alive: its shards' node and, for a peer copy, the holder; for a
    peer copy read from another copy (re-replication), the holder and the node that serves that
    copy, or the holder alone for a copy off the nodes (shared, S3)."""
    if batch.holder is None:
        return [batch.node]
    if batch.source_tier is None:
        return [batch.node, batch.holder]
    return [batch.holder, *([batch.source_node] if batch.source_node is not None else [])]


def _batch_tiers(stage: StageInput) -> tuple[PlanTier, ...]:
    return (stage.tier,) if stage.source is None else (stage.source, stage.tier)


def _start_stripes(stage: StageInput, batch: Batch) -> workflow.ActivityHandle[BatchResult]:
    """A batch of a coded tier's copy stage, on the queue of the node that does it: the shards'
    node encodes and unstages, the holder (`batch.holder`) pulls; in a re-replication the new
    holder cuts its stripes again."""
    assert stage.source is not None and stage.stripes is not None
    arg: EncodeInput | PullInput
    if stage.stripes in (StripePhase.PULL, StripePhase.REBUILD):
        rebuild = stage.stripes is StripePhase.REBUILD
        name = REBUILD_BATCH if rebuild else PULL_BATCH
        arg = (RebuildInput if rebuild else PullInput)(
            checkpoint_id=stage.checkpoint_id,
            job=stage.job,
            step=stage.step,
            batch=batch,
            tier=stage.tier.name,
        )
    else:
        name = ENCODE_BATCH if stage.stripes is StripePhase.ENCODE else UNSTAGE_BATCH
        arg = EncodeInput(
            checkpoint_id=stage.checkpoint_id,
            job=stage.job,
            step=stage.step,
            batch=batch,
            source=stage.source.name,
            tier=stage.tier.name,
            holders=stage.stripe_holders.get(batch.node),
        )
    return workflow.start_activity(
        name,
        arg,
        result_type=BatchResult,
        task_queue=_batch_queue(batch, stage.source, stage.tier),
        start_to_close_timeout=BATCH_TIMEOUT,
        heartbeat_timeout=timedelta(seconds=stage.batch_heartbeat_seconds),
        retry_policy=BATCH_RETRY,
    )


def _start_batch(stage: StageInput, batch: Batch) -> workflow.ActivityHandle[BatchResult]:
    if stage.stripes is not None:
        return _start_stripes(stage, batch)
    if stage.source is None:
        return workflow.start_activity(
            SEAL_BATCH,
            SealInput(
                checkpoint_id=stage.checkpoint_id,
                job=stage.job,
                step=stage.step,
                batch=batch,
                tier=stage.tier.name,
            ),
            result_type=BatchResult,
            task_queue=_batch_queue(batch, stage.tier),
            start_to_close_timeout=BATCH_TIMEOUT,
            heartbeat_timeout=timedelta(seconds=stage.batch_heartbeat_seconds),
            retry_policy=BATCH_RETRY,
        )
    return workflow.start_activity(
        COPY_BATCH,
        CopyInput(
            checkpoint_id=stage.checkpoint_id,
            job=stage.job,
            step=stage.step,
            batch=batch,
            source=batch.source_tier or stage.source.name,
            destination=stage.tier.name,
        ),
        result_type=BatchResult,
        task_queue=_batch_queue(batch, stage.source, stage.tier),
        start_to_close_timeout=BATCH_TIMEOUT,
        heartbeat_timeout=timedelta(seconds=stage.batch_heartbeat_seconds),
        retry_policy=BATCH_RETRY,
    )


class LostNodes:
    """Nodes declared lost, and the batch activities in flight on each node's queue: no worker
    will ever serve a lost node's queue again, so its batches are cancelled rather than waited
    for, and later ones are not scheduled."""

    def __init__(self, lost: list[str] | None = None) -> None:
        self.nodes: set[str] = set(lost or ())
        self._running: dict[str, list[workflow.ActivityHandle[BatchResult]]] = {}

    def declare(self, node: str) -> None:
        self.nodes.add(node)
        for handle in self._running.pop(node, []):
            handle.cancel()

    def track(self, node: str, handle: workflow.ActivityHandle[BatchResult]) -> None:
        self._running.setdefault(node, []).append(handle)

    def untrack(self, node: str, handle: workflow.ActivityHandle[BatchResult]) -> None:
        running = self._running.get(node, [])
        if handle in running:
            running.remove(handle)


def lost_reason(node: str) -> str:
    return f"node {node} was declared lost"


async def run_window(
    stage: StageInput, lost: LostNodes, status: LifecycleStatus | None = None
) -> StageResult:
    """One activity per batch, at most tier.parallelism at once (a sliding window).

    Failures are batches that gave up after their retries, or whose node was declared lost;
    corrupt shards are not failures here: the promote activity finds them in the catalog.
    """
    failures: list[str] = []
    source_damaged = 0
    on_node = on_nodes_queues(*_batch_tiers(stage))
    # On the nodes' queues every node copies with its own disks and network: a window across
    # all nodes would run `parallelism` batches at a time for the whole cluster.
    per_node = on_node and stage.window_per_node
    windows: dict[str, asyncio.Semaphore] = {}

    def window_of(batch: Batch) -> asyncio.Semaphore:
        key = batch.runs_on if per_node else ""
        if key not in windows:
            windows[key] = asyncio.Semaphore(stage.tier.parallelism)
        return windows[key]

    async def one(batch: Batch) -> None:
        nonlocal source_damaged
        async with window_of(batch):
            where = f"batch {batch.node}[{batch.first}..{batch.last}]"
            if batch.holder is not None:
                where += f" on {batch.holder}"
            needs = _nodes_of(batch)

            def gone() -> str | None:
                return next((n for n in needs if on_node and n in lost.nodes), None)

            if (dead := gone()) is not None:
                failures.append(f"{where}: {lost_reason(dead)}")
            else:
                handle = _start_batch(stage, batch)
                if on_node:
                    for n in needs:
                        lost.track(n, handle)
                try:
                    done = await handle
                    # Added once the batch is done: `+= await` reads the sum before the wait,
                    # and would write over what batches finishing meanwhile added. (Histories
                    # where that lost a count replay alike: the repair request it should have
                    # caused is behind a patch that they never recorded.)
                    # guard: stage-sums-source-damage
                    source_damaged += done.source_damaged
                except ActivityError as err:
                    dead = gone()
                    why = lost_reason(dead) if dead is not None else error_message(err)
                    failures.append(f"{where}: {why}")
                except asyncio.CancelledError:
                    # Cancelled by a lost-node signal; anything else is the workflow's own.
                    dead = gone()
                    if dead is None:
                        raise
                    failures.append(f"{where}: {lost_reason(dead)}")
                finally:
                    for n in needs:
                        lost.untrack(n, handle)
            if status is not None:
                status.batches_done += 1

    await asyncio.gather(*(one(b) for b in stage.batches))
    return StageResult(
        batches=len(stage.batches),
        failures=len(failures),
        first_failure=failures[0] if failures else None,
        source_damaged=source_damaged,
    )


async def run_coded_stage(
    plan: LifecyclePlan,
    tier: PlanTier,
    source: PlanTier,
    lost: LostNodes,
    run_pass: Callable[[StageInput], Awaitable[StageResult]],
    status: LifecycleStatus | None = None,
) -> tuple[str | None, int]:
    """A coded tier's copy: every shards' node cuts its batches into stripes, then every holder
    pulls its own, then each node drops the stripes of the sets verified whole, each pass run by
    `run_pass` (a window, or children of it) and done before the next begins (a pull needs its
    stripes cut first). Why it is incomplete, if it is, and the shards whose source a batch
    found damaged."""
    holders = plan.stripe_holders.get(tier.name, {})
    encode = [b for b in plan.batches if b.node in holders]
    pull = [b.model_copy(update={"holder": h}) for b in encode for h in holders[b.node]]
    if status is not None:
        status.batches_total += 2 * len(encode) + len(pull)
    failures: list[str] = []
    damaged = 0
    for phase, batches in (
        (StripePhase.ENCODE, encode),
        (StripePhase.PULL, pull),
        (StripePhase.UNSTAGE, encode),
    ):
        stage = StageInput(
            checkpoint_id=plan.checkpoint_id,
            job=plan.job,
            step=plan.step,
            tier=tier,
            source=source,
            batches=batches,
            batch_heartbeat_seconds=plan.batch_heartbeat_seconds,
            lost_nodes=sorted(lost.nodes),
            window_per_node=True,
            stripes=phase,
            stripe_holders=holders,
        )
        done = await run_pass(stage)
        damaged += done.source_damaged
        if done.failures:
            failures.append(
                f"{phase}: {done.failures} of {done.batches} batches failed, "
                f"first: {done.first_failure}"
            )
    unplaced = sorted({b.node for b in plan.batches if b.node not in holders})
    if unplaced:
        failures.append(f"too few serving nodes to hold the stripes of {', '.join(unplaced)}")
    return "; ".join(failures) or None, damaged
