"""The scrub of a coded peer tier on one holder: each verified stripe it holds read back from its
device (at the tier's scrub bandwidth, through the same read as a replica's) and judged against
the size and crc32c the encoder recorded. A stripe that reads back wrong is moved `found bad`
(`corrupt`; missing: `lost`) at once, and its coded copy fails if some set is left below k
(`tierpoint/catalog/tier_copy/stripe_damage.py`); one read back good gets `scrubbed_at` and is
counted in the tier's totals. Once what it found is committed, the rebuild of every checkpoint
of the batch with stripes found bad is asked for (`tierpoint/services/stripe_rebuild.py`), which
cuts them again. Idempotent as the replica scrub: a retried batch resumes at the stripe its last
heartbeat named, a stripe already counted for this pick is not counted again, and the rebuild is
asked for again (read from the catalog, not from this attempt's findings)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from datetime import datetime

from temporalio import activity
from tierpoint_client.erasure import Code

from tierpoint import logs
from tierpoint import metrics_worker as metrics
from tierpoint.catalog.engine import Sessions
from tierpoint.catalog.replica import scrub as replica_scrub
from tierpoint.catalog.stripe import scrub
from tierpoint.catalog.stripe.scrub import StripeTarget
from tierpoint.catalog.tier_copy.stripe_damage import mark_stripes_damaged
from tierpoint.contract.integrity import PROBLEM_LIMIT, ScrubBatchInput, ScrubBatchResult
from tierpoint.states import ReplicaState
from tierpoint.storage.base import ShardRef, TierStore, VerifyResult

log = logs.get(__name__)

# The replica scrub's throttled read of one file at a heartbeat index: what the device holds,
# or None and why (a path that is not safe to read).
Read = Callable[[TierStore, ShardRef, int], tuple[VerifyResult | None, str | None]]
# Asks for the rebuild of those of the checkpoints whose coded copy on the tier has stripes found
# bad, after the commit.
AskRebuild = Callable[[str, Iterable[int]], None]


def judge_stripe(v: VerifyResult | None, t: StripeTarget, tier: str) -> tuple[ReplicaState, str]:
    """What a holder's read-back says of a stripe: (state it deserves, why)."""
    if v is None or v.size is None:
        return ReplicaState.LOST, f"missing on {tier}"
    if v.size != t.size:
        return ReplicaState.CORRUPT, f"size {v.size} != the encoder's {t.size}"
    # guard: stripe-scrub-checks-crc32c
    if v.crc32c != t.crc32c.lower():
        return ReplicaState.CORRUPT, f"crc32c {v.crc32c} != the encoder's {t.crc32c} (read back)"
    return ReplicaState.VERIFIED, ""


def scrub_stripes(
    sessions: Sessions,
    store: TierStore,
    code: Code,
    inp: ScrubBatchInput,
    read: Read,
    write_every: float,
    ask_rebuild: AskRebuild,
) -> ScrubBatchResult:
    """Read back the batch's stripes on their holder (this worker's node), writing what was
    found at least every `write_every` seconds and at once for a stripe found bad; then ask for
    the rebuild of the batch's checkpoints with stripes found bad."""
    details = activity.info().heartbeat_details
    start = int(details[-1]) if details else 0
    with sessions.begin() as s:
        todo = scrub.targets(s, inp.stripe_ids)
    result = ScrubBatchResult()
    picked_at = datetime.fromisoformat(inp.picked_at)
    good: list[int] = []
    bad: dict[ReplicaState, dict[tuple[int, int], str]] = {
        ReplicaState.CORRUPT: {},
        ReplicaState.LOST: {},
    }
    since = time.monotonic()

    def write() -> None:
        nonlocal since
        with sessions.begin() as s:
            stripes, nbytes = scrub.record_good(s, inp.tier, good, picked_at)
            result.stripes += stripes
            result.bytes += nbytes
            for state, problems in bad.items():
                damage = mark_stripes_damaged(s, inp.tier, code, problems, state, inp.actor)
                replica_scrub.record_bad(
                    s,
                    inp.tier,
                    corrupt=damage.marked if state is ReplicaState.CORRUPT else 0,
                    lost=damage.marked if state is ReplicaState.LOST else 0,
                )
        good.clear()
        for problems in bad.values():
            problems.clear()
        since = time.monotonic()

    for i, t in enumerate(todo):
        if i < start:
            continue
        activity.heartbeat(i)
        if t.state != ReplicaState.VERIFIED.value:
            result.skipped += 1
            continue
        v, unsafe = read(store, ShardRef(t.job, t.step, t.path, t.branch), i)
        if unsafe is not None:
            # E.g. a symlink out of the root put in place of the stripe: not these bytes.
            state, problem = ReplicaState.CORRUPT, f"unsafe: {unsafe}"
        else:
            state, problem = judge_stripe(v, t, inp.tier)
        result_label = "good" if state is ReplicaState.VERIFIED else state.value
        metrics.STRIPES_SCRUBBED.labels(inp.tier, result_label).inc()
        if state is ReplicaState.VERIFIED:
            good.append(t.stripe_id)
        else:
            _found_bad(result, bad, t, state, problem, inp)
            write()  # at once: no restore is offered a stripe known bad
        if time.monotonic() - since >= write_every:
            write()
    write()
    # After the commit, on every attempt: one retried after a failed ask skips the stripes it
    # marked (not verified any more) but reads them as due from the catalog.
    # guard: stripe-found-bad-asks-rebuild
    ask_rebuild(inp.tier, {t.checkpoint_id for t in todo})
    return result


def _found_bad(
    result: ScrubBatchResult,
    bad: dict[ReplicaState, dict[tuple[int, int], str]],
    t: StripeTarget,
    state: ReplicaState,
    problem: str,
    inp: ScrubBatchInput,
) -> None:
    bad[state][(t.shard_id, t.index)] = problem
    if state is ReplicaState.LOST:
        result.lost += 1
    else:
        result.corrupt += 1
    if len(result.problems) < PROBLEM_LIMIT:
        result.problems.append(f"{t.job}/{t.step}/{t.path} stripe {t.index}: {problem}")
    log.warning(f"{inp.actor} found a bad stripe", tier=inp.tier, path=t.path, why=problem)
