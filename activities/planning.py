"""The lifecycle's plan (`lifecycle.plan`): which tiers this step goes to (the job's policy,
`promote_every`), a tier copy on each of them (and none on the others), the S3 key layout each copy
keeps, the holders of its peer copies (placement.py) and its batches (batching.py), read under
the share lock of its nodes so that a node declared lost meanwhile is either seen here or sees
what the lifecycle writes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from pydantic import ValidationError
from temporalio.exceptions import ApplicationError
from tierpoint_client.erasure import Code

from tierpoint import logs
from tierpoint.catalog.checkpoint.shards import shard_ordinals_by_node
from tierpoint.catalog.engine import Session, Sessions
from tierpoint.catalog.job.lookup import CheckpointHead, checkpoint_head
from tierpoint.catalog.node import registry
from tierpoint.catalog.policy.assigned import policy_for_job
from tierpoint.catalog.replica import placement
from tierpoint.catalog.tier_copy import key_layouts
from tierpoint.catalog.tier_copy.machine import drop_skipped_tier_copies, ensure_tier_copies
from tierpoint.config import Settings
from tierpoint.contract.common import FailureType
from tierpoint.contract.lifecycle import BATCHES_PER_CHILD, LifecyclePlan, PlanInput, PlanTier
from tierpoint.retention.policy import promotion_targets, tier_refs
from tierpoint.storage.s3.layout import layout_in_force
from tierpoint.tier_config import TierConfig, TierKind

from .batching import batch_size, plan_batches
from .placement import holders_by_tier, stripe_holders

log = logs.get(__name__)


def plan_lifecycle(sessions: Sessions, settings: Settings, inp: PlanInput) -> LifecyclePlan:
    """The checkpoint's lifecycle plan (the activity `lifecycle.plan`); see the module."""
    with sessions.begin() as s:
        head = checkpoint_head(s, inp.checkpoint_id)
        if head is None:
            raise ApplicationError(
                f"checkpoint {inp.checkpoint_id} is not in the catalog",
                type=FailureType.CHECKPOINT_NOT_FOUND,
                non_retryable=True,
            )
        if not settings.tiers:
            raise ApplicationError(
                "no tiers are configured", type=FailureType.NO_TIERS, non_retryable=True
            )
        # The nodes first, in the catalog's lock order (nodes before tier copies).
        ordinals = shard_ordinals_by_node(s, head.id)
        lost = registry.lost_among(s, (n for n, _, _ in ordinals))
        tiers = _targets(settings, s, head)
        ensure_tier_copies(s, head, [t.name for t in tiers])
        # The S3 key layout in force now is this checkpoint's for good (a re-plan keeps it).
        key_layouts.record(
            s, head.id, {t.name: layout_in_force(t) for t in tiers if t.kind is TierKind.S3}
        )
        drop_skipped_tier_copies(s, head, [t.name for t in settings.tiers if t not in tiers])
        peers = [t for t in tiers if t.kind is TierKind.PEER]
        configured = [t.name for t in settings.peer_tiers()]
        serving = registry.serving_nodes(s) if peers else []
        # A source that is not serving is placed too, away from its own domain.
        placed = [*serving, *(n for n, _, _ in ordinals)] if peers else []
        domains = registry.failure_domains(s, placed)
        # A retried run's copies go nowhere near the copies the other peer tiers hold.
        kept = placement.copy_holders(s, head.id, configured) if peers else {}
    sources = {n for n, _, _ in ordinals}
    # Every peer tier of the configuration (not only this step's targets) is placed in its
    # order, so a step that skips a peer tier moves no other tier's copies.
    placed_on = holders_by_tier(sources, serving, configured, domains, kept)
    holders = {t.name: placed_on[t.name] for t in peers}
    stripes = {
        t.name: _stripe_holders(sources, serving, t.stripe_code, domains)
        for t in peers
        if t.stripe_code is not None
    }
    size = batch_size(settings, len(ordinals))
    # Split by bytes for the stages on the nodes' queues (the seal, and the copy off the
    # local tier), whose windows are per node: a shared tier's large window (an S3 tier
    # sized for a whole cluster) must not cut every node's shards into that many batches.
    batches = plan_batches(
        ordinals,
        size,
        max((t.parallelism for t in tiers[:2]), default=1),
        settings.min_batch_bytes,
    )
    with logs.checkpoint_context(job=head.job, step=head.step):
        log.info("lifecycle planned", tiers=[t.name for t in tiers], shards=len(ordinals))
    return LifecyclePlan(
        checkpoint_id=head.id,
        job=head.job,
        step=head.step,
        shard_count=len(ordinals),
        total_bytes=head.total_bytes,
        tiers=[
            PlanTier(name=t.name, kind=t.kind, parallelism=t.parallelism, code=t.code)
            for t in tiers
        ],
        batches=batches,
        batches_per_child=BATCHES_PER_CHILD,
        batch_heartbeat_seconds=settings.batch_heartbeat_timeout_seconds,
        lost_nodes=lost,
        holders=holders,
        stripe_holders=stripes,
    )


def _stripe_holders(
    sources: Iterable[str],
    serving: Sequence[str],
    code: Code,
    domains: Mapping[str, str | None],
) -> dict[str, list[str]]:
    """Each source node's stripe holders; a node without enough other serving nodes has none."""
    out = {}
    for n in sorted(set(sources)):
        holders = stripe_holders(n, serving, code, domains)
        if holders is not None:
            out[n] = holders
    return out


def _targets(settings: Settings, session: Session, head: CheckpointHead) -> list[TierConfig]:
    """The tiers the job's retention policy sends this checkpoint to (`promote_every`, by step
    multiple); each copies from the previous one in this list. A policy that does not
    validate sends it everywhere: an extra copy is safe, a missing one is not."""
    tiers = settings.tiers
    try:
        policy = policy_for_job(session, head.job).policy
    except ValidationError:
        log.warning("unreadable retention policy: copying to every tier", job=head.job)
        return list(tiers)
    targets = set(promotion_targets(policy, tier_refs(tiers), head.step))
    return [t for t in tiers if t.name in targets]
