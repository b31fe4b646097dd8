"""A stage too large for one history: its batches in child workflows (CheckpointLifecycleStage)
of at most `LifecyclePlan.batches_per_child` each, so the lifecycle's history holds a few events
per child instead of a few per batch. The seal and the copy stages run here, and so does each pass
of a coded tier's copy stage. The children running now are kept, so that a node declared lost
reaches the ones holding its batches."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from tierpoint.contract.lifecycle import (
        CHILD_LOST_CATCH_UP_PATCH,
        NODE_LOST_SIGNAL,
        STAGE_WORKFLOW,
        Batch,
        LifecycleStatus,
        StageInput,
        StageResult,
    )

from workflows.lifecycle_window import LostNodes


class StageChildren:
    def __init__(self, status: LifecycleStatus, lost: LostNodes) -> None:
        self._status = status
        # The lifecycle's own: the nodes declared lost so far.
        self._lost = lost
        # The ids of the children running now, which a lost-node signal is passed on to.
        self._running: list[str] = []

    async def pass_on(self, node: str) -> None:
        """Tell every running child that `node` was declared lost."""
        for child in list(self._running):
            await self._signal(child, node)

    async def _signal(self, child: str, node: str) -> None:
        try:
            await workflow.get_external_workflow_handle(child).signal(NODE_LOST_SIGNAL, node)
        except Exception as err:
            # A signal handler that raises fails the workflow task over and over; the
            # operator repeats the declaration, which signals this workflow again.
            workflow.logger.warning("node_lost not passed on to %s: %s", child, err)

    async def _catch_up(self, child: str, told: list[str]) -> None:
        """Nodes declared lost after the child's input was made and before the child existed:
        what was passed on meanwhile found no workflow to signal, and the child would wait on a
        lost node's queue for good. (Histories recorded before replay without these signals.)"""
        missed = sorted(self._lost.nodes - set(told))
        # guard: stage-child-catches-up-on-lost-nodes
        if missed and workflow.patched(CHILD_LOST_CATCH_UP_PATCH):
            for node in missed:
                await self._signal(child, node)

    async def run(
        self,
        name: str,
        batches: list[Batch],
        size: int,
        slice_of: Callable[[list[Batch]], StageInput],
        *,
        at_once: bool,
    ) -> list[StageResult]:
        """`batches` in children of `size` batches each, `<workflow id>/<name>/<n>`, each given
        `slice_of(its batches)` when it starts. `at_once` on the nodes' queues, where each node
        keeps its own window; one after the other on the shared queue, where the stage's one
        window of `parallelism` holds only so."""
        chunks = [batches[i : i + size] for i in range(0, len(batches), size)]

        async def child(n: int, chunk: list[Batch]) -> StageResult:
            child_id = f"{workflow.info().workflow_id}/{name}/{n}"
            self._running.append(child_id)
            try:
                inp = slice_of(chunk)
                # Started, then waited for: the same commands as executing it.
                handle = await workflow.start_child_workflow(
                    STAGE_WORKFLOW, inp, id=child_id, result_type=StageResult
                )
                await self._catch_up(child_id, inp.lost_nodes)
                res: StageResult = await handle
            finally:
                self._running.remove(child_id)
            self._status.batches_done += len(chunk)
            return res

        if at_once:
            return list(await asyncio.gather(*(child(n, c) for n, c in enumerate(chunks))))
        return [await child(n, c) for n, c in enumerate(chunks)]


def merged(results: list[StageResult]) -> StageResult:
    """One result for a stage run in several children."""
    return StageResult(
        batches=sum(r.batches for r in results),
        failures=sum(r.failures for r in results),
        first_failure=next((r.first_failure for r in results if r.first_failure), None),
        source_damaged=sum(r.source_damaged for r in results),
    )
