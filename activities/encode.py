"""The first step of a coded peer tier's copy: the shards' own node cuts each sealed file of a
batch into its k+m stripes, in one pass that also checks the file against its registered size
and crc32c, stages them (`tierpoint/storage/posix/staging.py`) and records each stripe placed
(pending) on its holder, with the size and crc32c it cut, through the stripe machine. The
holders pull their stripes from the staging area afterwards.

Idempotent: a shard whose k+m stripes are placed and staged at the recorded sizes is not read
again; one placed but not (or not wholly) staged is cut again, and the catalog keeps the stripes
it recorded first (the codec cuts the same bytes into the same stripes). Heartbeats as it reads.
"""

from __future__ import annotations

from temporalio import activity
from temporalio.exceptions import ApplicationError
from tierpoint_client.erasure import Code
from tierpoint_client.erasure.stripes import StripeInfo

from tierpoint import logs
from tierpoint.catalog.checkpoint.shards import batch_shards, checkpoint_branch
from tierpoint.catalog.engine import Sessions
from tierpoint.catalog.node import registry
from tierpoint.catalog.stripe import encoding, machine
from tierpoint.catalog.stripe.coverage import verified_stripes
from tierpoint.config import Settings
from tierpoint.contract.common import FailureType
from tierpoint.contract.lifecycle import PROBLEM_EXAMPLES, BatchResult
from tierpoint.contract.stripes import ENCODE_BATCH, UNSTAGE_BATCH, EncodeInput
from tierpoint.errors import UnknownTier, UnsafePath
from tierpoint.storage.base import ChecksumMismatch, ShardRef, SourceSizeMismatch, TierStore
from tierpoint.storage.posix.staging import StripeStaging
from tierpoint.tier_config import TierConfig

from .placement import stripe_holders
from .registration import on_node_queue
from .stores import Stores, ensure_reachable

log = logs.get(__name__)


def _refused(message: str, kind: FailureType) -> ApplicationError:
    return ApplicationError(message, type=kind, non_retryable=True)


class EncodeActivities:
    def __init__(
        self, sessions: Sessions, settings: Settings, stores: Stores, node: str | None = None
    ) -> None:
        self._sessions = sessions
        self._settings = settings
        self._stores = stores
        self._node = node

    def _tiers(self, inp: EncodeInput) -> tuple[TierConfig, TierConfig, Code]:
        try:
            source, coded = self._stores.tier(inp.source), self._stores.tier(inp.tier)
        except UnknownTier as exc:
            raise _refused(str(exc), FailureType.UNKNOWN_TIER) from exc
        code = coded.stripe_code
        if code is None:
            raise _refused(f"tier {coded.name} keeps copies, not stripes", FailureType.UNKNOWN_TIER)
        ensure_reachable(source, inp.batch.node, self._node)
        return source, coded, code

    @on_node_queue
    @activity.defn(name=ENCODE_BATCH)
    def encode_batch(self, inp: EncodeInput) -> BatchResult:
        source, coded, code = self._tiers(inp)
        node = inp.batch.node
        with self._sessions.begin() as s:
            if registry.is_lost(s, node):
                raise _refused(f"node {node} was declared lost", FailureType.NODE_LOST)
            found = encoding.to_encode(
                s,
                inp.checkpoint_id,
                node,
                source.name,
                coded.name,
                (inp.batch.first, inp.batch.last),
            )
            serving = registry.serving_nodes(s)
            domains = registry.failure_domains(s, serving)
        if found is None:
            raise _refused(
                f"checkpoint {inp.checkpoint_id} is not in the catalog",
                FailureType.CHECKPOINT_NOT_FOUND,
            )
        holders = inp.holders or stripe_holders(node, serving, code, domains)
        if holders is None:
            # Retried: nodes that have not reported in lately may come back.
            raise ApplicationError(
                f"{code} on tier {coded.name} needs {code.width} serving nodes besides {node}; "
                f"{len(set(serving) - {node})} serve"
            )
        if len(set(holders)) != code.width or node in holders:
            raise _refused(
                f"{code} needs {code.width} distinct holders other than {node}, not {holders}",
                FailureType.UNKNOWN_TIER,
            )
        result = BatchResult(shards=len(found.shards))
        store = self._stores.get(source, node)
        batch = _Batch(self._sessions, store, inp, found, code, coded, holders, result)
        try:
            for n, shard in enumerate(found.shards):
                activity.heartbeat(n)
                batch.one(shard, n)
        except UnsafePath as exc:
            raise _refused(str(exc), FailureType.UNSAFE_PATH) from exc
        log.info(
            "batch encoded",
            tier=coded.name,
            node=node,
            staged=result.verified,
            skipped=result.skipped,
            corrupt=result.corrupt,
        )
        return result

    @on_node_queue
    @activity.defn(name=UNSTAGE_BATCH)
    def unstage_batch(self, inp: EncodeInput) -> BatchResult:
        """Drop from the staging area the stripes of the batch's shards whose every stripe is
        verified on a holder not lost: each only while it holds the bytes the encoder recorded.
        A set not whole yet keeps all its staged stripes (a holder may still pull again)."""
        _, coded, code = self._tiers(inp)
        b = inp.batch
        with self._sessions.begin() as s:
            shards = batch_shards(s, inp.checkpoint_id, b.node, b.first, b.last, coded.name)
            branch = checkpoint_branch(s, inp.checkpoint_id)
            counts = verified_stripes(s, inp.checkpoint_id, coded.name)
            # guard: unstage-only-whole-sets
            whole = [sh.id for sh in shards if counts.get(sh.id, 0) >= code.width]
            staged = encoding.staged_copies(s, inp.checkpoint_id, coded.name, b.node, whole)
        staging = StripeStaging(coded, b.node)
        result = BatchResult(shards=len(shards), verified=len(whole))
        for index, copies in staged.items():
            activity.heartbeat(index)
            done = staging.store(index).delete_checkpoint(inp.job, inp.step, copies, branch)
            result.skipped += len(done.kept)
            result.problems.extend(f"{p}: kept, not the recorded stripe" for p in done.kept)
        del result.problems[PROBLEM_EXAMPLES:]
        return result


class _Batch:
    """One batch's shards, cut one after the other."""

    def __init__(
        self,
        sessions: Sessions,
        store: TierStore,
        inp: EncodeInput,
        found: encoding.EncodeSet,
        code: Code,
        coded: TierConfig,
        holders: list[str],
        result: BatchResult,
    ) -> None:
        self.sessions, self.inp, self.found = sessions, inp, found
        self.code, self.coded, self.holders, self.result = code, coded, holders, result
        self.store = store
        self.staging = StripeStaging(coded, inp.batch.node)

    def _note(self, path: str, reason: str) -> None:
        if len(self.result.problems) < PROBLEM_EXAMPLES:
            self.result.problems.append(f"{path}: {reason}")

    def _staged(self, ref: ShardRef, shard: encoding.ToEncode) -> bool:
        """Every stripe placed, and in the staging area at the size the encoder recorded."""
        return len(shard.placed) == self.code.width and all(
            self.staging.size(i, ref) == p.size for i, p in shard.placed.items()
        )

    def one(self, shard: encoding.ToEncode, n: int) -> None:
        f = self.found
        ref = ShardRef(f.job, f.step, shard.path, f.branch)
        if self._staged(ref, shard):
            self.result.skipped += 1
            self.result.verified += 1
            return
        try:
            with self.store.open_read(ref) as src:
                infos = self.staging.cut(
                    self.code,
                    ref,
                    src,
                    shard.size,
                    shard.crc32c,
                    lambda _done: activity.heartbeat(n),
                )
        except (FileNotFoundError, SourceSizeMismatch, ChecksumMismatch) as exc:
            # The sealed file is not the registered bytes any more: nothing is staged from it.
            self.result.corrupt += 1
            self.result.source_damaged += 1
            self._note(shard.path, str(exc) or type(exc).__name__)
            return
        self.result.bytes += shard.size
        differs = [
            i.index
            for i in infos
            if i.index in shard.placed
            and (shard.placed[i.index].size, shard.placed[i.index].crc32c) != (i.size, i.crc32c)
        ]
        if differs:
            # Recorded stripes are the ones a holder's read-back is judged by: never replaced.
            self.result.corrupt += 1
            self._note(shard.path, f"stripes {differs} cut again differ from those recorded")
            return
        self._place(shard, infos)
        self.result.verified += 1

    def _place(self, shard: encoding.ToEncode, infos: list[StripeInfo]) -> None:
        placed = [
            machine.PlacedStripe(
                shard.shard_id,
                i.index,
                shard.placed[i.index].node if i.index in shard.placed else self.holders[i.index],
                i.size,
                i.crc32c,
            )
            for i in infos
        ]
        with self.sessions.begin() as s:
            machine.place(s, self.inp.checkpoint_id, self.coded.name, str(self.code), placed)
