"""The Temporal client side: connecting, starting a checkpoint's lifecycle, asking for a job's
retention run, and the retention sweep schedule. Workflows are started by name with inputs from
`tierpoint.contract`, so nothing here imports workflow code."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio.client import (
    Client,
    Interceptor,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleUpdate,
    ScheduleUpdateInput,
    WorkflowExecutionStatus,
    WorkflowHandle,
)
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode, TLSConfig

from tierpoint.config import Settings
from tierpoint.contract.common import SHARED_TASK_QUEUE
from tierpoint.contract.integrity import (
    RECONCILE_SCHEDULE_ID,
    RECONCILE_WORKFLOW,
    REPAIR_SIGNAL,
    REPAIR_WORKFLOW,
    SCRUB_SCHEDULE_ID,
    SCRUB_WORKFLOW,
    VERIFY_CHECKPOINT_WORKFLOW,
    VERIFY_WORKFLOW,
    ReconcileInput,
    RepairInput,
    RepairRequest,
    ScrubInput,
    VerifyCheckpointInput,
    VerifyInput,
    VerifyOutcome,
    repair_workflow_id,
)
from tierpoint.contract.lifecycle import (
    LIFECYCLE_WORKFLOW,
    NODE_LOST_SIGNAL,
    LifecycleInput,
    workflow_id,
)
from tierpoint.contract.peer import (
    REPLAN_SIGNAL,
    REREPLICATE_WORKFLOW,
    RereplicateInput,
    rereplicate_id,
)
from tierpoint.contract.retention import (
    REQUEST_SIGNAL,
    RETENTION_WORKFLOW,
    SWEEP_SCHEDULE_ID,
    SWEEP_WORKFLOW,
    RetentionInput,
    RetentionRequest,
    retention_workflow_id,
)


async def connect(settings: Settings, interceptors: Sequence[Interceptor] = ()) -> Client:
    """A Temporal client with the pydantic data converter (API, workers, tests and replay alike)."""
    return await Client.connect(
        settings.temporal_address,
        namespace=settings.temporal_namespace,
        data_converter=pydantic_data_converter,
        interceptors=interceptors,
        tls=tls_config(settings),
        api_key=(
            settings.temporal_api_key.get_secret_value()
            if settings.temporal_api_key is not None
            else None
        ),
    )


def tls_config(settings: Settings) -> TLSConfig | None:
    """TLS (mTLS with a client certificate) from the `temporal_tls_*` settings; None leaves it
    to the SDK (off, or on with an API key)."""
    if not settings.temporal_tls():
        return None

    def read(path: Path | None) -> bytes | None:
        return path.read_bytes() if path is not None else None

    return TLSConfig(
        server_root_ca_cert=read(settings.temporal_tls_ca),
        client_cert=read(settings.temporal_tls_cert),
        client_private_key=read(settings.temporal_tls_key),
        domain=settings.temporal_tls_server_name,
    )


async def start_lifecycle(client: Client, inp: LifecycleInput, run_id: str | None = None) -> bool:
    """Start the workflow for a registered checkpoint (under `run_id`, for a retry). Returns False
    if one already exists or existed under that id: a checkpoint has exactly one first lifecycle,
    and each retry one run, however often this is called."""
    wid = run_id or workflow_id(inp.job, inp.step, inp.branch)
    try:
        # A run under the id, open or closed, refuses the start: whose it is decides below.
        await client.start_workflow(
            LIFECYCLE_WORKFLOW,
            inp,
            id=wid,
            task_queue=SHARED_TASK_QUEUE,
            id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
        )
    except WorkflowAlreadyStartedError:
        if run_id is not None or not await _ran_for_another(client, wid, inp):
            return False
        # The step was deleted by an admin and registered again, or registered again in a catalog
        # restored from a backup: the run under the step's id was another registration's. Closed,
        # or still running (a delete with force of a checkpoint in flight) for a row that is
        # gone: this one needs its own run, and joining that one would leave it without any.
        await client.start_workflow(
            LIFECYCLE_WORKFLOW,
            inp,
            id=wid,
            task_queue=SHARED_TASK_QUEUE,
            # guard: deleted-run-gives-way
            id_conflict_policy=WorkflowIDConflictPolicy.TERMINATE_EXISTING,
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
        )
    return True


async def start_peer_rereplication(
    client: Client, inp: RereplicateInput, lost: str, branch: int = 1
) -> None:
    """Copy again, to new holders, the peer copies the lost node `lost` held (of the checkpoint
    saved at the step on `branch`). One run at a time per checkpoint: a run under way is
    signalled instead (signal-with-start), since it may be copying to that very node; it plans
    again once its copies ended."""
    await _start_peer_run(client, inp, branch, NODE_LOST_SIGNAL, [lost])


async def start_peer_replan(client: Client, inp: RereplicateInput, branch: int = 1) -> None:
    """Copy again the checkpoint's peer copies that failed, now that a node may be free for them
    (its other peer copy there expired). A run under way is told to plan again once its copies
    ended, as for a lost node."""
    await _start_peer_run(client, inp, branch, REPLAN_SIGNAL, [])


async def _start_peer_run(
    client: Client, inp: RereplicateInput, branch: int, signal: str, args: list[str]
) -> None:
    await client.start_workflow(
        REREPLICATE_WORKFLOW,
        inp,
        id=rereplicate_id(inp.job, inp.step, branch),
        task_queue=SHARED_TASK_QUEUE,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
        start_signal=signal,
        start_signal_args=args,
    )


async def _ran_for_another(client: Client, wid: str, inp: LifecycleInput) -> bool:
    """Whether the latest run under `wid` was started for another registration: another
    checkpoint id, or the same id registered at another time (a catalog restored from a backup
    hands its ids out again). Read from its first history event: only on a refused start, which
    is rare."""
    async for event in client.get_workflow_handle(wid).fetch_history_events():
        payloads = event.workflow_execution_started_event_attributes.input.payloads
        if not payloads:
            return False
        (first,) = await client.data_converter.decode(payloads[:1], [LifecycleInput])
        if not isinstance(first, LifecycleInput):
            return False
        if first.checkpoint_id != inp.checkpoint_id:
            return True
        known = first.registered_at is not None and inp.registered_at is not None
        return known and first.registered_at != inp.registered_at
    return False


async def is_running(client: Client, workflow_id: str) -> bool:
    """Whether the workflow with this id has an open run (describe is consistent, unlike list)."""
    try:
        desc = await client.get_workflow_handle(workflow_id).describe()
    except RPCError as err:
        if err.status is RPCStatusCode.NOT_FOUND:
            return False
        raise
    return desc.status is WorkflowExecutionStatus.RUNNING


async def signal_node_lost(client: Client, job: str, step: int, node: str, branch: int = 1) -> bool:
    """Tell a checkpoint's lifecycle that `node` is lost. False if it is not running: not started
    yet (its plan will read the node as lost) or finished."""
    try:
        handle = client.get_workflow_handle(workflow_id(job, step, branch))
        await handle.signal(NODE_LOST_SIGNAL, node)
    except RPCError as exc:
        if exc.status is RPCStatusCode.NOT_FOUND:
            return False
        raise
    return True


async def request_retention(client: Client, job: str, reason: str) -> None:
    """Ask for a retention pass over `job`: starts the job's retention workflow, or signals the
    running one (which then runs one more pass after the current one, however many requests
    arrive meanwhile). Cheap and safe to call as often as wanted."""
    await client.start_workflow(
        RETENTION_WORKFLOW,
        RetentionInput(job=job),
        id=retention_workflow_id(job),
        task_queue=SHARED_TASK_QUEUE,
        start_signal=REQUEST_SIGNAL,
        start_signal_args=[RetentionRequest(reason=reason)],
    )


async def request_repair(
    client: Client, checkpoint_id: int, job: str, step: int, reason: str, branch: int = 1
) -> None:
    """Ask for a repair run of one checkpoint's damaged copies (signal-with-start of
    `checkpoint/<job>/<step>/repair`, `<step>.b<N>` on later branches): requests during a run
    coalesce into one more round. The id names the checkpoint, not the step: a request for
    another checkpoint of the same step would otherwise only signal this one's run."""
    await client.start_workflow(
        REPAIR_WORKFLOW,
        RepairInput(checkpoint_id=checkpoint_id, job=job, step=step),
        id=repair_workflow_id(job, step, branch),
        task_queue=SHARED_TASK_QUEUE,
        start_signal=REPAIR_SIGNAL,
        start_signal_args=[RepairRequest(reason=reason)],
    )


def verify_workflow_id(replica_ids: list[int], stripe_ids: list[int] | None = None) -> str:
    if stripe_ids:
        return f"verify/stripes/{'-'.join(str(i) for i in sorted(stripe_ids))}"
    return f"verify/{'-'.join(str(i) for i in sorted(replica_ids))}"


async def start_verify(client: Client, inp: VerifyInput) -> str:
    """Re-read replicas (or stripes) now; reports of the same ones share one run
    (USE_EXISTING)."""
    wid = verify_workflow_id(inp.replica_ids, inp.stripe_ids)
    await client.start_workflow(
        VERIFY_WORKFLOW,
        inp,
        id=wid,
        task_queue=SHARED_TASK_QUEUE,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )
    return wid


async def start_verify_checkpoint(
    client: Client, inp: VerifyCheckpointInput, wid: str
) -> tuple[WorkflowHandle[Any, VerifyOutcome], bool]:
    """Start the verification of a checkpoint's copy on a tier, or join the one running under
    `wid` (False: joined). A finished run does not block a new one."""
    try:
        handle = await client.start_workflow(
            VERIFY_CHECKPOINT_WORKFLOW,
            inp,
            id=wid,
            task_queue=SHARED_TASK_QUEUE,
            result_type=VerifyOutcome,
            id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
        )
    except WorkflowAlreadyStartedError:
        return client.get_workflow_handle(wid, result_type=VerifyOutcome), False
    return handle, True


async def start_reconcile(client: Client, inp: ReconcileInput, run_id: str) -> str:
    wid = f"reconcile/{run_id}"
    await client.start_workflow(
        RECONCILE_WORKFLOW,
        inp,
        id=wid,
        task_queue=SHARED_TASK_QUEUE,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )
    return wid


def _periodic(workflow: str, schedule_id: str, interval: timedelta, *args: object) -> Schedule:
    return Schedule(
        action=ScheduleActionStartWorkflow(
            workflow,
            args=list(args),
            id=f"{schedule_id}/run",
            task_queue=SHARED_TASK_QUEUE,
            execution_timeout=max(interval, timedelta(minutes=30)),
        ),
        spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=interval)]),
        # A sweep still running when the next is due makes the next one pointless.
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP),
    )


def _sweep_schedule(interval: timedelta) -> Schedule:
    return _periodic(SWEEP_WORKFLOW, SWEEP_SCHEDULE_ID, interval)


async def ensure_sweep_schedule(client: Client, interval: timedelta) -> None:
    """Create the `tierpoint.retention-sweep` schedule, or bring an existing one's action, interval
    and overlap policy up to date (keeping its state, e.g. paused by an operator). Safe to call
    from every shared worker at every start."""
    await _ensure_schedule(client, SWEEP_SCHEDULE_ID, _sweep_schedule(interval))


async def ensure_integrity_schedules(
    client: Client, scrub: timedelta | None, reconcile: timedelta | None
) -> None:
    """The `tierpoint.scrub` and `tierpoint.reconcile` schedules as the settings want them: kept
    up to date when an interval is given, deleted when not (turned off)."""
    wanted = {
        SCRUB_SCHEDULE_ID: None
        if scrub is None
        else _periodic(SCRUB_WORKFLOW, SCRUB_SCHEDULE_ID, scrub, ScrubInput()),
        RECONCILE_SCHEDULE_ID: None
        if reconcile is None
        else _periodic(
            RECONCILE_WORKFLOW, RECONCILE_SCHEDULE_ID, reconcile, ReconcileInput(repair=True)
        ),
    }
    for sid, schedule in wanted.items():
        if schedule is not None:
            await _ensure_schedule(client, sid, schedule)
            continue
        with contextlib.suppress(RPCError):
            await client.get_schedule_handle(sid).delete()


async def _ensure_schedule(client: Client, schedule_id: str, wanted: Schedule) -> None:
    try:
        await client.create_schedule(schedule_id, wanted)
        return
    except ScheduleAlreadyRunningError:
        pass

    def update(current: ScheduleUpdateInput) -> ScheduleUpdate | None:
        have = current.description.schedule
        if have.spec.intervals == wanted.spec.intervals and have.policy == wanted.policy:
            return None
        return ScheduleUpdate(
            schedule=dataclasses.replace(
                have, action=wanted.action, spec=wanted.spec, policy=wanted.policy
            )
        )

    await client.get_schedule_handle(schedule_id).update(update)
