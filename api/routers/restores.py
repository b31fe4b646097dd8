"""A restarting job's one question: which step to load, from where, under which lease. One
request answers all three, so a job's restore costs the API the same whatever its size (its
coordinator asks, and hands every rank the sources of the files that rank reads)."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from api.auth import JOB_READ, LEASE_WRITE, Actor, PrincipalDep, require_job
from api.deps import BranchQuery, JobName, SessionDep, StateDep, Step
from api.gate import GatedRoute
from api.problems import problem_responses
from api.schemas.restores import (
    CachedCopiesIn,
    CachedCopiesOut,
    CodedCopyOut,
    CodedFileOut,
    NodeCachedCopies,
    RestoreOut,
    StartRestore,
)
from api.schemas.tiers import TierOut
from tierpoint.auth import Scope
from tierpoint.catalog.holds.leases import create_lease
from tierpoint.catalog.node import registry
from tierpoint.catalog.reads import checkpoints
from tierpoint.catalog.reads.coded_plan import restore_coded_copies
from tierpoint.catalog.reads.views import PlanStripe
from tierpoint.services.cached_copies import record_cached_copies
from tierpoint.services.restore import LeaseRequest, latest_with_lease

router = APIRouter(prefix="/v1/jobs", tags=["leases"], route_class=GatedRoute)


@router.post(
    "/{job:path}/restores",
    status_code=201,
    response_model=RestoreOut,
    responses=problem_responses(404, 409, 422),
    summary="Start a restore: the step, a lease on it, and every copy of its files",
    dependencies=[Depends(JOB_READ)],
)
async def start_restore(
    job: JobName,
    body: StartRestore,
    session: SessionDep,
    state: StateDep,
    principal: PrincipalDep,
    actor: Actor,
) -> RestoreOut:
    """Without `step`: the latest checkpoint the caller can restore, as `GET
    .../checkpoints/latest` chooses it (`tier`, `node`, `branch`, `health` included), 404
    `no_restorable_checkpoint` when there is none. With `step`: the checkpoint at that step (on
    `branch` when given, else the one on the job's timeline), 404 `checkpoint_not_found` or 409
    `not_leasable` when it is restorable from no tier. Either way a restore lease is taken on it
    in the same transaction as the answer is read (release it with `DELETE .../leases/{id}` when
    the restore is done), and the answer carries the checkpoint with every shard's replicas, its
    restorable coded copies with the stripes to read (`coded`: a coded tier keeps stripes, not
    replicas) and the tier configuration: all a reader needs to read any file from its fastest
    verified copy.
    A forked job with no restorable checkpoint of its own answers its fork parent's checkpoint
    (`fork_parent`): `job`, `step` and `branch` are the parent's, whose files they are, and the
    lease is on it. 422 `unknown_tier`, `unknown_node` for a tier not configured or a node no
    worker reported from. The token needs what reading the checkpoint and taking a lease need:
    train:<job>, or read and operate."""
    # guard: restore-without-lease-scope
    LEASE_WRITE.check(principal, job)
    if body.tier is not None:
        state.settings.tier(body.tier, location="body")
    if body.node is not None:
        await session.run_sync(registry.require_known, body.node)
    tiers = state.settings.tiers
    # Either way the checkpoint is read under the lease, which keeps every copy listed from
    # expiring.
    if body.step is None:
        lease = LeaseRequest(body.ttl_seconds, body.owner, actor)
        found = await latest_with_lease(
            session,
            job,
            tiers,
            tier=body.tier,
            node=body.node,
            lease=lease,
            branch=body.branch,
            good=body.health == "good",
        )
        assert found.lease is not None  # asked for with the answer
        # The chosen checkpoint's own job, step and branch: a fork parent's are not the job's.
        # guard: restore-names-the-fork-parent
        owner, step, branch = found.job, found.step, found.checkpoint.branch
        taken, skipped, inherited = found.lease, found.skipped, found.fork_parent
        detail = await session.run_sync(
            checkpoints.get_checkpoint, owner, step, tiers, branch=branch
        )
    else:
        owner, step, skipped, inherited = job, body.step, [], False
        taken = await session.run_sync(
            create_lease, job, step, body.ttl_seconds, body.owner, actor, branch=body.branch
        )
        detail = await session.run_sync(
            checkpoints.get_checkpoint, job, step, tiers, branch=body.branch
        )
    coded = _coded(await session.run_sync(restore_coded_copies, detail, tiers))
    return RestoreOut.model_validate(
        {
            "job": owner,
            "step": step,
            "branch": detail.branch,
            "fork_parent": inherited,
            "lease": taken,
            "checkpoint": detail,
            "tiers": [TierOut.of(t) for t in tiers],
            "skipped": skipped,
            "coded": coded,
        },
        from_attributes=True,
    )


def _coded(found: dict[str, tuple[str, dict[str, list[PlanStripe]]]]) -> list[CodedCopyOut]:
    return [
        CodedCopyOut(
            tier=tier,
            code=code,
            files=[
                CodedFileOut.model_validate({"path": p, "stripes": s}, from_attributes=True)
                for p, s in files.items()
            ],
        )
        for tier, (code, files) in found.items()
    ]


@router.post(
    "/{job:path}/checkpoints/{step}/cached-copies",
    response_model=CachedCopiesOut,
    responses=problem_responses(404, 422),
    summary="Record the files a load's ranks keep on their nodes' local tier",
    dependencies=[Depends(require_job(Scope.OPERATE))],
)
async def record_cached(
    job: JobName,
    step: Step,
    body: CachedCopiesIn,
    session: SessionDep,
    state: StateDep,
    branch: BranchQuery = None,
) -> CachedCopiesOut:
    """A load's coordinator, once for all its ranks and before any writes one: the files each
    node will keep on its local tier although the catalog holds no copy of them there (another
    node's files that its ranks load). Expiring the checkpoint's copy on that tier deletes them
    with the node's own files. Answers what was recorded, which is all a reader may keep: a
    node's own files are left out (they are the catalog's copies), and nothing is recorded once
    the copy on the tier is being expired. Recording again changes nothing. 422 for a tier that
    is not local (`unknown_tier`, `validation_error`), an unknown node (`unknown_node`) or a
    path that is no file of the checkpoint (`validation_error`). `branch`: the checkpoint saved
    at the step on that branch (a load names the one it read; without it, the one on the job's
    timeline). The token needs what a restore lease needs: train:<job>, or operate."""
    wanted: dict[str, list[str]] = {}
    for entry in body.copies:
        wanted.setdefault(entry.node, []).extend(entry.paths)
    recorded = await session.run_sync(
        record_cached_copies, state.settings, job, step, body.tier, wanted, branch
    )
    return CachedCopiesOut(
        tier=body.tier,
        copies=[NodeCachedCopies(node=n, paths=p) for n, p in sorted(recorded.items())],
    )
