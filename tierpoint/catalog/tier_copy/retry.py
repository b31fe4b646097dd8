"""The catalog side of an operator's retry: the failed tier copies of a checkpoint, locked, and
their reset to `pending` with the retry recorded; and the one rule of whether a retry can help at
all, which the retry itself obeys and the failures view shows beside each failure (so no retry is
offered where it could only be refused). Verified replicas are never touched: the new lifecycle
run skips them."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from sqlalchemy import exists, func, select, true
from sqlalchemy.orm import Session

from tierpoint.catalog.engine import catalog_now
from tierpoint.catalog.events import EventKind, record
from tierpoint.catalog.job.lookup import no_checkpoint, require_job_id
from tierpoint.catalog.locks import (
    ACTION_LOCK,
    EVERY_TIER_COPY,
    CheckpointAt,
    Locked,
    lock_in_order,
)
from tierpoint.catalog.models import Checkpoint, Event, Node, Shard, TierCopy
from tierpoint.catalog.tier_copy.machine import Move, move
from tierpoint.errors import CopyOnLostNode, NoVerifiedSource, RepairInProgress, TierpointError
from tierpoint.states import TierState

RETRY = "retry"

# Tier copies a lifecycle run passes through on its way to a failed tier: it reseals or copies a
# pending or failed one, and copies on from a restorable one. Any other state (retention expired
# the copy) ends the run there, and the tiers after it would stay `pending` with no run to move
# them.
_PASSABLE = (TierState.RESTORABLE.value, TierState.PENDING.value, TierState.FAILED.value)


@dataclass(frozen=True)
class RetryFacts:
    """What decides whether a new lifecycle run can fix a checkpoint's failed tier copies."""

    # every tier copy of the checkpoint: tier -> (state, reason)
    tier_copies: dict[str, tuple[str, str | None]]
    # tier -> the tiers a repair or re-replication is copying it back from, while it holds them
    rebuilding: dict[str, list[str]] = field(default_factory=dict)
    # nodes declared lost that hold some of the checkpoint's shards
    lost_nodes: list[str] = field(default_factory=list)

    @property
    def failed(self) -> dict[str, str | None]:
        """Failed tier -> its reason."""
        return {t: r for t, (st, r) in self.tier_copies.items() if st == TierState.FAILED.value}


@dataclass(frozen=True)
class RetryTarget:
    checkpoint_id: int
    job_id: int
    attempt: int  # this retry's number: 1 for the first
    facts: RetryFacts
    # the checkpoint row and its tier copies, held until the retry's transaction ends
    locked: Locked = field(default_factory=Locked, compare=False, repr=False)

    @property
    def failed(self) -> dict[str, str | None]:
        return self.facts.failed


def refusal(
    job: str, step: int, tiers: Sequence[str], local: Collection[str], facts: RetryFacts
) -> TierpointError | None:
    """Why a retry of the checkpoint's failed tiers cannot help, or None when it can (or when
    nothing failed). `tiers`: the configured tiers in order (the order a run copies in);
    `local`: those of them local to a node."""
    failed = facts.failed
    rebuilt = {t: facts.rebuilding[t] for t in sorted(failed) if facts.rebuilding.get(t)}
    # guard: retry-during-repair
    if rebuilt:
        what = "; ".join(f"{t} from {', '.join(src)}" for t, src in rebuilt.items())
        why = f"a repair is copying it back ({what}) and promotes it when done"
        return RepairInProgress(f"{job}/{step}: {why}", extra={"rebuilding": rebuilt, "why": why})
    order = [t for t in tiers if t in facts.tier_copies]
    first = next((t for t in order if t in failed), None)
    if first is None:
        return None  # failed tiers no longer configured: the run does not copy to them
    before = order[: order.index(first)]
    gone = {t: facts.tier_copies[t][0] for t in before if facts.tier_copies[t][0] not in _PASSABLE}
    # guard: retry-without-source
    if gone:
        what = ", ".join(f"{t} is {state}" for t, state in gone.items())
        why = f"the copies a new run would start from are gone ({what})"
        reasons = "; ".join(
            f"{t} failed: {reason or 'no reason recorded'}" for t, reason in sorted(failed.items())
        )
        return NoVerifiedSource(
            f"{job}/{step} cannot be retried: {why}; {reasons}",
            extra={"gone": gone, "failed": sorted(failed), "why": why},
        )
    if first in local and facts.lost_nodes:
        # The run would seal or copy there on the lost nodes' queues, which no worker serves
        # again: the tier fails once more, and every tier after it with it.
        why = f"its copy on {first} was on node(s) {', '.join(facts.lost_nodes)}, declared lost"
        return CopyOnLostNode(
            f"{job}/{step} cannot be retried: {why}; restore from another tier, and acknowledge "
            "the failure",
            extra={"tier": first, "nodes": facts.lost_nodes, "why": why},
        )
    return None


def retry_facts(session: Session, checkpoint_ids: Sequence[int]) -> dict[int, RetryFacts]:
    """The facts `refusal` needs, for each of the checkpoints (bounded by the caller's page)."""
    if not checkpoint_ids:
        return {}
    now = catalog_now(session)
    ct = TierCopy
    tier_copies: dict[int, dict[str, tuple[str, str | None]]] = defaultdict(dict)
    rebuilding: dict[int, dict[str, list[str]]] = defaultdict(dict)
    for m in session.execute(
        select(ct.checkpoint_id, ct.tier, ct.state, ct.reason, ct.rebuild_from, ct.rebuild_until)
        .where(ct.checkpoint_id.in_(checkpoint_ids))
        .order_by(ct.checkpoint_id, ct.tier)
    ):
        tier_copies[m.checkpoint_id][m.tier] = (m.state, m.reason)
        if m.rebuild_from and m.rebuild_until is not None and m.rebuild_until > now:
            rebuilding[m.checkpoint_id][m.tier] = list(m.rebuild_from)
    lost: dict[int, list[str]] = defaultdict(list)
    for cid, node in _lost_nodes_holding(session, checkpoint_ids):
        lost[cid].append(node)
    return {
        cid: RetryFacts(tier_copies[cid], rebuilding.get(cid, {}), sorted(lost.get(cid, [])))
        for cid in checkpoint_ids
    }


def _lost_nodes_holding(session: Session, checkpoint_ids: Sequence[int]) -> list[tuple[int, str]]:
    # Lost nodes are few: one probe of the shards' (checkpoint, node) index per pair.
    held = exists().where(Shard.checkpoint_id == Checkpoint.id, Shard.node_id == Node.id)
    rows = session.execute(
        select(Checkpoint.id, Node.id)
        .join(Node, true())  # every (checkpoint, lost node) pair, each probed once by `held`
        .where(Checkpoint.id.in_(checkpoint_ids), Node.lost_at.is_not(None), held)
    )
    return [(r[0], r[1]) for r in rows]


def lock_failed(session: Session, job: str, step: int, branch: int | None = None) -> RetryTarget:
    """The checkpoint's tier copies (the checkpoint at `step`, on `branch` when given:
    `locks.at_step`), with the checkpoint row and those tier copies locked until commit, so that
    no promotion (nor expiry) can move them between the retry's start and its reset (raises
    JobNotFound, CheckpointNotFound)."""
    locked = lock_in_order(
        session,
        checkpoints=CheckpointAt(job, step, branch),
        checkpoint_lock=ACTION_LOCK,
        tier_copies=EVERY_TIER_COPY,
    )
    if not locked.checkpoints:
        require_job_id(session, job)
        raise no_checkpoint(job, step, branch)
    (checkpoint,) = locked.checkpoints.values()
    checkpoint_id, job_id = checkpoint.id, checkpoint.job_id
    facts = retry_facts(session, [checkpoint_id])[checkpoint_id]
    done = session.scalar(
        select(func.count()).where(
            Event.checkpoint_id == checkpoint_id,
            Event.kind == EventKind.OPERATOR_ACTION.value,
            Event.detail["action"].astext == RETRY,
        )
    )
    return RetryTarget(checkpoint_id, job_id, int(done or 0) + 1, facts, locked)


def reset_failed(session: Session, target: RetryTarget, actor: str, workflow_id: str) -> None:
    """Failed tier copies back to `pending` (in flight again), and the retry as an event."""
    copies = [(target.checkpoint_id, t) for t in target.failed]
    move(session, target.locked, Move.RETRIED, copies, reason=None)
    record(
        session,
        EventKind.OPERATOR_ACTION,
        checkpoint_id=target.checkpoint_id,
        job_id=target.job_id,
        actor=actor,
        detail={
            "action": RETRY,
            "attempt": target.attempt,
            "workflow_id": workflow_id,
            "tiers": sorted(target.failed),
            "reasons": target.failed,
        },
    )
