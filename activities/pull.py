"""The second step of a coded peer tier's copy: each holder pulls the stripes placed on it from
the staging area of the shards' node, through that node's data endpoint (`<tier>~<index>`),
as a peer copy is pulled: the crc32c computed in the same pass as the atomic write under the
holder's root of the tier, then the stripe read back from the holder's device. The stripe is
recorded `read back` with what the read-back found, so the stripe machine verifies it only when
that is the size and crc32c the encoder recorded.

A stripe whose bytes arrive other than the encoder recorded is taken back and read again (a
flip in transit is not the stripe's fault); still wrong after that, its read-back records it
corrupt. A stripe the shards' node does not serve (gone from its staging area, or not its
recorded size there) is reported and left as it is: its set is not whole, so the copy is not
promoted. A holder or a shards' node that cannot be reached fails the attempt, which is
retried; stripes already verified are not read again.
"""

from __future__ import annotations

from temporalio import activity
from temporalio.exceptions import ApplicationError

from tierpoint import logs
from tierpoint.catalog.engine import Sessions
from tierpoint.catalog.node import registry
from tierpoint.catalog.stripe import machine, pulling
from tierpoint.config import Settings
from tierpoint.contract.common import FailureType
from tierpoint.contract.lifecycle import PROBLEM_EXAMPLES, BatchResult
from tierpoint.contract.stripes import PULL_BATCH, PullInput
from tierpoint.errors import UnknownTier, UnsafePath
from tierpoint.states import ReplicaState
from tierpoint.storage.base import ShardRef, TierStore
from tierpoint.storage.peer_http import STRIPE_MARK, PeerSource, pull_tls
from tierpoint.tier_config import TierConfig

from .registration import on_node_queue
from .stores import Stores, ensure_reachable

log = logs.get(__name__)

# A stripe whose bytes arrive other than recorded is read again this many times.
REREADS_AFTER_MISMATCH = 2


def _refused(message: str, kind: FailureType) -> ApplicationError:
    return ApplicationError(message, type=kind, non_retryable=True)


class PullActivities:
    def __init__(
        self, sessions: Sessions, settings: Settings, stores: Stores, node: str | None = None
    ) -> None:
        self._sessions = sessions
        self._settings = settings
        self._stores = stores
        self._node = node

    def _tier(self, name: str, holder: str) -> TierConfig:
        try:
            tier = self._stores.tier(name)
        except UnknownTier as exc:
            raise _refused(str(exc), FailureType.UNKNOWN_TIER) from exc
        if tier.stripe_code is None:
            raise _refused(f"tier {tier.name} keeps copies, not stripes", FailureType.UNKNOWN_TIER)
        ensure_reachable(tier, holder, self._node)
        return tier

    @on_node_queue
    @activity.defn(name=PULL_BATCH)
    def pull_batch(self, inp: PullInput) -> BatchResult:
        b = inp.batch
        if b.holder is None:
            raise _refused("a stripe pull runs on a holder's queue", FailureType.WRONG_NODE)
        tier = self._tier(inp.tier, b.holder)
        with self._sessions.begin() as s:
            for node in (b.holder, b.node):
                if registry.is_lost(s, node):
                    raise _refused(f"node {node} was declared lost", FailureType.NODE_LOST)
            found = pulling.to_pull(
                s, inp.checkpoint_id, tier.name, b.node, b.holder, (b.first, b.last)
            )
            url = registry.data_urls(s, [b.node]).get(b.node)
        if found is None:
            raise _refused(
                f"checkpoint {inp.checkpoint_id} is not in the catalog",
                FailureType.CHECKPOINT_NOT_FOUND,
            )
        if url is None:
            # Retried: the node's worker may be restarting, and reports its endpoint when up.
            raise ApplicationError(f"node {b.node} serves no data endpoint", type="NoDataEndpoint")
        result = BatchResult(shards=len(found.stripes))
        store = self._stores.get(tier, b.holder)
        token = self._settings.data_token
        secret = token.get_secret_value() if token else None
        tls = pull_tls(self._settings) if url.startswith("https:") else None
        try:
            for n, stripe in enumerate(found.stripes):
                activity.heartbeat(n)
                if stripe.state == ReplicaState.VERIFIED.value:
                    result.skipped += 1
                    result.verified += 1
                    continue
                staged = f"{tier.name}{STRIPE_MARK}{stripe.index}"
                source = PeerSource(url, staged, secret, tls)
                try:
                    self._pull(inp, found, stripe, source, store, result)
                except FileNotFoundError as exc:
                    # Not served: gone from the staging area or not its recorded size there.
                    # No retry of this pull brings it back (an encode run again does), so the
                    # stripe stays as it is, and its set not whole fails the copy's promotion.
                    result.corrupt += 1
                    if len(result.problems) < PROBLEM_EXAMPLES:
                        result.problems.append(f"{stripe.path} stripe {stripe.index}: {exc}")
        except UnsafePath as exc:
            raise _refused(str(exc), FailureType.UNSAFE_PATH) from exc
        log.info(
            "stripes pulled",
            tier=tier.name,
            node=b.node,
            holder=b.holder,
            verified=result.verified,
            corrupt=result.corrupt,
        )
        return result

    def _pull(
        self,
        inp: PullInput,
        found: pulling.PullSet,
        stripe: pulling.ToPull,
        source: PeerSource,
        store: TierStore,
        result: BatchResult,
    ) -> None:
        ref = found_ref(found, stripe)
        for attempt in range(REREADS_AFTER_MISMATCH + 1):
            with source.open_read(ref) as raw:
                written = store.write(ref, raw, stripe.size, None, None)
            result.bytes += written.size
            if written.crc32c == stripe.crc32c or attempt == REREADS_AFTER_MISMATCH:
                break
            # Not the encoder's bytes: take back only what this write committed, read again.
            store.delete(ref, written.identity)
        # What the holder's device holds now, not what was sent: the stripe machine judges it.
        back = store.verify(ref, stripe.size, stripe.crc32c)
        size = back.size if back.size is not None else -1
        # guard: stripe-judged-by-the-holders-read-back
        crc = back.crc32c or "missing"
        read = machine.ReadBack(stripe.shard_id, stripe.index, size, crc)
        with self._sessions.begin() as s:
            moved = machine.read_back(s, inp.tier, [read])
        if moved.get(ReplicaState.VERIFIED.value):
            result.verified += 1
        else:
            result.corrupt += 1
            if len(result.problems) < PROBLEM_EXAMPLES:
                result.problems.append(f"{stripe.path} stripe {stripe.index}: {back.reason}")


def found_ref(found: pulling.PullSet, stripe: pulling.ToPull) -> ShardRef:
    """A held stripe lies at its shard's name under the holder's root of the tier: a holder
    holds at most one stripe of a shard."""
    return ShardRef(found.job, found.step, stripe.path, found.branch)
