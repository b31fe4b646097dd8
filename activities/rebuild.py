"""A coded peer tier's rebuild on a new holder: each stripe that a re-replication moved to this
node (re-placed: its old holder lost, or its copy found corrupt) is cut again from k other
stripes of its set, read off their holders' data endpoints (`<tier>~<index>`) as a restore
reads them: any k, data stripes first, each checked for size and crc32c as it lands, a holder
down or a stripe that does not match read around (`erasure.rebuild_stripe`). The file is decoded
segment by segment, each segment's fragment of the lost index coded again, and the decoded file
checked against the shard's registered crc32c before anything is kept.

The codec is deterministic, so the stripe cut again must be the encoder's: its size and crc32c
are compared with the ones the encoder recorded, and anything else is never written. Then, as a
pull does, it is written atomically at the shard's name under this node's root of the tier, read
back from the device, and recorded `read back` with what that read found: the stripe machine
verifies it only when those are the encoder's.

A batch cuts two stripes at a time (`FILES_AT_ONCE`): one file's decode, write and read-back run
beside the next one's reads, and a holder slow to answer for one file holds back one of them, not
the batch.

A set that has fewer than k readable stripes now (holders down, not lost) fails the attempt,
which is retried; one that the catalog has below k is reported and left (no retry brings its
stripes back); stripes verified already are not cut again.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import BinaryIO, cast

from temporalio import activity
from temporalio.exceptions import ApplicationError
from tierpoint_client.erasure import (
    Code,
    FileMismatchError,
    NotEnoughStripesError,
    StripeRef,
    rebuild_stripe,
)

from tierpoint import logs
from tierpoint.catalog.engine import Sessions
from tierpoint.catalog.holds import rebuild as rebuild_holds
from tierpoint.catalog.node import registry
from tierpoint.catalog.stripe import machine, pulling, rebuilding, restoring
from tierpoint.config import Settings
from tierpoint.contract.common import FailureType
from tierpoint.contract.lifecycle import PROBLEM_EXAMPLES, BatchResult
from tierpoint.contract.stripes import REBUILD_BATCH, RebuildInput
from tierpoint.errors import UnknownTier, UnsafePath
from tierpoint.states import ReplicaState
from tierpoint.storage.base import ShardRef, TierStore
from tierpoint.storage.peer_http import STRIPE_MARK, PeerSource, pull_tls
from tierpoint.storage.posix.scratch import scratch_dir
from tierpoint.tier_config import TierConfig

from .pull import found_ref
from .registration import on_node_queue
from .stores import Stores, ensure_reachable

log = logs.get(__name__)

# Retried: a set whose holders are down now (not lost) may be readable again shortly.
SHORT_OF_K = "StripesShortOfK"
# The rebuilds' scratch area in the worker's temp directory.
_SCRATCH = "tierpoint-rebuild"


# Stripes cut at once in a batch: one file's decode and read-back beside the next one's reads,
# as a copy batch reads one shard back while it copies the next.
FILES_AT_ONCE = 2


@dataclass(frozen=True)
class _Cut:
    """A stripe of the batch to cut again: its place in the batch (for heartbeats), its row,
    its file's registered size and crc32c, and the stripes of its set to read it from."""

    n: int
    stripe: pulling.ToPull
    file: rebuilding.File
    others: list[StripeRef]


@dataclass(frozen=True)
class _Outcome:
    """What cutting one stripe found: verified on the holder, or why not."""

    verified: bool
    problem: str | None
    bytes: int = 0


def _refused(message: str, kind: FailureType) -> ApplicationError:
    return ApplicationError(message, type=kind, non_retryable=True)


class _Beating:
    """A stripe's reader that heartbeats as it reads: the fetch reads k stripes in threads of
    its own, outside the activity's context, so each beat runs in a copy of that context."""

    def __init__(self, raw: BinaryIO, beat: Callable[[], None]) -> None:
        self._raw, self._beat = raw, beat

    def read(self, n: int = -1) -> bytes:
        self._beat()
        return self._raw.read(n)

    def __enter__(self) -> _Beating:
        return self

    def __exit__(self, *exc: object) -> None:
        self._raw.close()


class RebuildActivities:
    def __init__(
        self, sessions: Sessions, settings: Settings, stores: Stores, node: str | None = None
    ) -> None:
        self._sessions = sessions
        self._settings = settings
        self._stores = stores
        self._node = node

    def _tier(self, name: str, holder: str) -> tuple[TierConfig, Code]:
        try:
            tier = self._stores.tier(name)
        except UnknownTier as exc:
            raise _refused(str(exc), FailureType.UNKNOWN_TIER) from exc
        if tier.stripe_code is None:
            raise _refused(f"tier {tier.name} keeps copies, not stripes", FailureType.UNKNOWN_TIER)
        ensure_reachable(tier, holder, self._node)
        return tier, tier.stripe_code

    @on_node_queue
    @activity.defn(name=REBUILD_BATCH)
    def rebuild_batch(self, inp: RebuildInput) -> BatchResult:
        b = inp.batch
        if b.holder is None:
            raise _refused(
                "a stripe rebuild runs on its new holder's queue", FailureType.WRONG_NODE
            )
        tier, code = self._tier(inp.tier, b.holder)
        with self._sessions.begin() as s:
            if registry.is_lost(s, b.holder):
                raise _refused(f"node {b.holder} was declared lost", FailureType.NODE_LOST)
            # The copy's own stripes are what this batch reads: its hold on them lasts on.
            rebuild_holds.renew(s, inp.checkpoint_id)
            found = pulling.to_pull(
                s, inp.checkpoint_id, tier.name, b.node, b.holder, (b.first, b.last)
            )
            held = restoring.restorable_stripes(s, inp.checkpoint_id, tier.name)
            files = rebuilding.files(s, [st.shard_id for st in found.stripes] if found else [])
            urls = registry.data_urls(s, {h.node for hs in held.values() for h in hs})
        if found is None:
            raise _refused(
                f"checkpoint {inp.checkpoint_id} is not in the catalog",
                FailureType.CHECKPOINT_NOT_FOUND,
            )
        result = BatchResult(shards=len(found.stripes))
        store = self._stores.get(tier, b.holder)
        cuts: list[_Cut] = []
        for n, stripe in enumerate(found.stripes):
            if stripe.state == ReplicaState.VERIFIED.value:
                result.skipped += 1
                result.verified += 1
                continue
            kept = [h for h in held.get(stripe.shard_id, []) if h.index != stripe.index]
            if len(kept) < code.k:
                # Below k in the catalog: nothing can cut it again, and no retry mends that.
                why = f"fewer than {code.k} verified stripes of its set are left"
                _problem(result, f"{stripe.path} stripe {stripe.index}: {why}")
                continue
            file = files.get(stripe.shard_id)
            if file is None:
                # Not sealed with a crc32c: nothing to check a decode against.
                _problem(result, f"{stripe.path}: no registered crc32c")
                continue
            # Their holders' endpoints now; one down is read around, and a set short of k
            # readable stripes is retried.
            others = [StripeRef(h.index, h.crc32c, urls[h.node]) for h in kept if h.node in urls]
            cuts.append(_Cut(n, stripe, file, others))
        try:
            short = self._cut_all(inp.tier, code, found, store, cuts, result)
        except UnsafePath as exc:
            raise _refused(str(exc), FailureType.UNSAFE_PATH) from exc
        log.info(
            "stripes rebuilt",
            tier=tier.name,
            node=b.node,
            holder=b.holder,
            verified=result.verified,
            corrupt=result.corrupt,
            short_of_k=len(short),
        )
        if short:
            raise ApplicationError(
                f"{len(short)} stripe(s) have fewer than {code.k} readable others now, first: "
                f"{short[0]}",
                type=SHORT_OF_K,
            )
        return result

    def _opener(
        self, tier: str, ref: ShardRef, beat: Callable[[], None]
    ) -> Callable[[StripeRef], BinaryIO]:
        token = self._settings.data_token
        secret = token.get_secret_value() if token else None

        def open_stripe(at: StripeRef) -> BinaryIO:
            tls = pull_tls(self._settings) if at.where.startswith("https:") else None
            source = PeerSource(at.where, f"{tier}{STRIPE_MARK}{at.index}", secret, tls)
            return cast(BinaryIO, _Beating(source.open_read(ref), beat))

        return open_stripe

    def _cut_all(
        self,
        tier: str,
        code: Code,
        found: pulling.PullSet,
        store: TierStore,
        cuts: list[_Cut],
        result: BatchResult,
    ) -> list[str]:
        """Every stripe of `cuts` cut again, FILES_AT_ONCE at a time, what each found added to
        `result` in the batch's order; the stripes whose set had fewer than k readable others."""
        short: list[str] = []
        pool = ThreadPoolExecutor(max_workers=FILES_AT_ONCE, thread_name_prefix="tierpoint-cut")
        try:
            # Each in a copy of the activity's context, so that its reads can heartbeat.
            futures = [
                pool.submit(
                    contextvars.copy_context().run, self._rebuild, tier, code, found, c, store
                )
                for c in cuts
            ]
            for cut, future in zip(cuts, futures, strict=True):
                try:
                    done = future.result()
                except NotEnoughStripesError as exc:
                    short.append(f"{cut.stripe.path} stripe {cut.stripe.index}: {exc}")
                    continue
                result.bytes += done.bytes
                result.verified += done.verified
                result.corrupt += not done.verified
                if done.problem is not None:
                    _problem(result, done.problem)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        return short

    def _rebuild(
        self, tier: str, code: Code, found: pulling.PullSet, cut: _Cut, store: TierStore
    ) -> _Outcome:
        """One stripe cut again and, when it is the encoder's, written and read back."""
        stripe, file, n = cut.stripe, cut.file, cut.n
        activity.heartbeat(n)
        others = cut.others
        ref = found_ref(found, stripe)
        ctx = contextvars.copy_context()

        def beat() -> None:
            ctx.copy().run(activity.heartbeat, n)

        # The k stripes fetched and the one cut: a scratch directory that a rebuild after this
        # one reclaims if this worker is killed before it removes it.
        with scratch_dir(_SCRATCH) as tmp:
            dest = tmp / "stripe"
            try:
                done = rebuild_stripe(
                    code,
                    file.size,
                    file.crc32c,
                    others,
                    self._opener(tier, ref, beat),
                    stripe.index,
                    dest,
                )
            except FileMismatchError as exc:
                # Every stripe read matched its crc32c, the file did not: the set is wrong.
                return _Outcome(False, f"{stripe.path} stripe {stripe.index}: {exc}")
            assert done.rebuilt is not None
            cut_as = (done.rebuilt.size, done.rebuilt.crc32c)
            # guard: rebuilt-stripe-is-the-encoders
            if cut_as != (stripe.size, stripe.crc32c):
                # Never kept: only the encoder's bytes may be recorded for this stripe.
                return _Outcome(
                    False,
                    f"{stripe.path} stripe {stripe.index}: cut again to {done.rebuilt.size} "
                    f"bytes, crc32c {done.rebuilt.crc32c}; the encoder's {stripe.size}, "
                    f"{stripe.crc32c}",
                )
            with open(dest, "rb") as f:
                written = store.write(ref, f, stripe.size, None, None)
        # What the holder's device holds now, not what was cut: the stripe machine judges it.
        back = store.verify(ref, stripe.size, stripe.crc32c)
        size = back.size if back.size is not None else -1
        read = machine.ReadBack(stripe.shard_id, stripe.index, size, back.crc32c or "missing")
        with self._sessions.begin() as s:
            moved = machine.read_back(s, tier, [read])
        if moved.get(ReplicaState.VERIFIED.value):
            return _Outcome(True, None, written.size)
        return _Outcome(False, f"{stripe.path} stripe {stripe.index}: {back.reason}", written.size)


def _problem(result: BatchResult, what: str) -> None:
    if len(result.problems) < PROBLEM_EXAMPLES:
        result.problems.append(what)
