"""`TierpointReader`: a DCP StorageReader that loads the latest restorable checkpoint of a job (or
a given step) from the fastest verified copy of each file, under one restore lease per load."""

from __future__ import annotations

import dataclasses
import functools
import os
import pickle
import socket
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner, ReadItem
from torch.distributed.checkpoint.storage import StorageReader
from torch.futures import Future

from tierpoint_client.client import Client
from tierpoint_client.errors import (
    ConflictError,
    NotFoundError,
    NoVerifiedCopyError,
    TierpointError,
)
from tierpoint_client.models import Checkpoint, PlanEntry, RestoreStart, TierInfo
from tierpoint_client.torch._copies import CheckpointFiles, ReadOptions, ReadStats
from tierpoint_client.torch._files import (
    METADATA_FILE,
    SCHEME,
    TierpointStorageInfo,
    parse_checkpoint_id,
    resolve_node,
)
from tierpoint_client.torch._kept import RankNode, record_kept
from tierpoint_client.torch._load import FileLoad


@dataclass
class _Chosen:
    step: int
    metadata: Metadata
    # This rank's sources: the coordinator's from the whole checkpoint; another rank's from what
    # the coordinator sent with its load plan (None until then).
    files: CheckpointFiles | None
    # The load's one lease, held by the coordinator alone (None on the other ranks, and once
    # released).
    lease_id: int | None
    # The coordinator's answer from the server: every file's copies, for every rank's plan.
    start: RestoreStart | None = None
    # The coordinator's `.metadata` as read and verified (kept on its node once recorded).
    metadata_bytes: bytes = b""


@dataclass(frozen=True)
class _RankSources:
    """What the coordinator adds to a rank's load plan: the checkpoint's files that the plan
    reads, each with every copy the catalog lists (a rank picks its own node's), and the tiers."""

    checkpoint: Checkpoint
    tiers: tuple[TierInfo, ...]
    # Other nodes' files the rank may keep on its node's local tier: recorded by the server.
    keep: frozenset[str]


class TierpointReader(StorageReader):
    """Load `job` (its latest restorable step, or `step`) with `dcp.load`.

    The coordinator (rank 0 of `process_group`, the default group when torch.distributed is
    initialised) alone talks to the server: one request chooses the step, takes one restore lease
    for the whole load and lists every copy of every file. It reads and verifies `.metadata`,
    passes it to the other ranks, so every rank loads the same step, and with each rank's load
    plan sends the copies of the files that plan reads, nothing more. So a load costs the server
    the same at any world size. The lease is released once, by the coordinator, when every rank's
    reads are done (or lapses after `lease_ttl` seconds if the job dies). Each rank reads each file
    from the first verified source: this node's local tier (with `node`, or TIERPOINT_NODE), then
    the shared tier, then S3; `tier` restricts the sources to one tier. A copy that fails
    verification is reported with a warning and to the server (`Client.report_corrupt_copy`), and
    the next one is read. If no copy of the newest step's `.metadata` verifies, the reader warns
    and loads the next older restorable step (unless `step` was given).

    With `repopulate`, every file a rank read whole from elsewhere is also written to this node's
    local tier (where the writer would have put it), so a restart on this node reads it locally:
    the node's own files put back in place, and other nodes' files kept as a cache, read only
    after it verifies. The coordinator records the latter for all ranks in one request before
    any is written (`Client.record_cached_copies`), so expiring the checkpoint's copy on the
    local tier deletes them with the node's own files. S3 files of
    at least `min_ranged_size` bytes of which a rank needs at most half are read in ranges, each
    item verified against its own crc32c from the verified `.metadata`. `stats` says what was read
    from where.
    """

    def __init__(
        self,
        job: str,
        *,
        step: int | None = None,
        client: Client | None = None,
        node: str | None = None,
        tier: str | None = None,
        lease_ttl: int = 1800,
        process_group: Any = None,
        repopulate: bool = True,
        min_ranged_size: int = ReadOptions.min_ranged_size,
    ) -> None:
        super().__init__()
        self.job = job
        self.step = step
        self._client = client
        self.node = resolve_node(node, required=False)
        self.tier = tier
        self.lease_ttl = lease_ttl
        self.process_group = process_group
        self.options = ReadOptions(repopulate=repopulate, min_ranged_size=min_ranged_size)
        self.chosen: _Chosen | None = None
        self.storage_data: dict[Any, TierpointStorageInfo] = {}
        # Whether this load's ranks coordinate through collectives (every rank alike).
        self._collective = False

    @property
    def checkpoint_id(self) -> str:
        step = self.chosen.step if self.chosen is not None else self.step
        return f"{SCHEME}{self.job}" + (f"/{step}" if step is not None else "")

    @property
    def stats(self) -> ReadStats:
        """What this rank read, and from where (empty before a load)."""
        chosen = self.chosen
        return chosen.files.stats if chosen is not None and chosen.files else ReadStats()

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = Client.from_env()
        return self._client

    # -- StorageReader ---------------------------------------------------------------------

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        parsed = parse_checkpoint_id(checkpoint_id)
        if parsed is not None:
            self.job, self.step = parsed
        # A lease still held here is a load that failed before its reads: no rank reads it now.
        self._drop_lease()
        self.chosen = None
        self._collective = False

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return parse_checkpoint_id(checkpoint_id) is not None

    def read_metadata(self, *args: Any) -> Metadata:
        # No **kwargs: DCP would retry a failed read as per-rank metadata, which we never write.
        group = self.process_group
        self._collective = False
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
            self.chosen = self._choose()
        elif dist.get_rank(group) == 0:
            self._collective = True
            payload: list[Any]
            try:
                self.chosen = self._choose()
                payload = [("ok", self.chosen.step, self.chosen.metadata)]
            except Exception as e:
                # The other ranks wait in the broadcast: they must hear of the failure too.
                dist.broadcast_object_list([("error", repr(e))], src=_global(group, 0), group=group)
                raise
            # Only the metadata: each rank's sources go with its load plan.
            dist.broadcast_object_list(payload, src=_global(group, 0), group=group)
        else:
            self._collective = True
            received: list[Any] = [None]
            dist.broadcast_object_list(received, src=_global(group, 0), group=group)
            message = received[0]
            if message[0] != "ok":
                raise TierpointError(f"the coordinator could not choose a checkpoint: {message[1]}")
            _, step, metadata = message
            self.chosen = _Chosen(step, metadata, None, None)
        metadata = self.chosen.metadata
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.checkpoint_id = self.checkpoint_id
        return metadata

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        if metadata.storage_data is None:
            raise TierpointError(f"{self.checkpoint_id}: metadata without storage data")
        self.storage_data = metadata.storage_data

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        # The coordinator learns each rank's node with its plan: where its files may be kept.
        return dataclasses.replace(plan, storage_data=RankNode(self.node, self.options.repopulate))

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        start = self.chosen.start if self.chosen is not None else None
        if start is None:
            raise TierpointError("planning a load before its checkpoint was chosen")
        shards = start.checkpoint.shards or ()
        ranks = [p.storage_data if isinstance(p.storage_data, RankNode) else None for p in plans]
        reads = [{self.storage_data[item.storage_index].path for item in p.items} for p in plans]
        node = self.node if self.options.repopulate else None
        kept = record_kept(self.client, start, ranks, reads, coordinator=node)
        planned = []
        for plan, rank, paths in zip(plans, ranks, reads, strict=True):
            mine = dataclasses.replace(
                start.checkpoint, shards=tuple(s for s in shards if s.path in paths)
            )
            keep = frozenset(kept.get(rank.node, set()) & paths) if rank and rank.node else None
            sources = _RankSources(mine, start.tiers, keep or frozenset())
            planned.append(dataclasses.replace(plan, storage_data=sources))
        chosen = self.chosen
        if chosen is not None and chosen.files is not None and self.node in kept:
            # The coordinator's `.metadata`, read and verified before the plans were made.
            chosen.files.allow_keeping(frozenset(kept[self.node] & {METADATA_FILE}))
            chosen.files.keep(METADATA_FILE, chosen.metadata_bytes)
        return planned

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        try:
            files = self._rank_files(plan)
            per_file: dict[str, list[ReadItem]] = {}
            for item in plan.items:
                per_file.setdefault(self.storage_data[item.storage_index].path, []).append(item)
            for path, items in per_file.items():
                infos = [self.storage_data[i.storage_index] for i in items]
                # Tensors are read straight into their targets where their layouts allow;
                # DCP gets them (commit_tensor, load_bytes) only once the whole file verified.
                load = FileLoad(planner, items, infos)
                load.finish(files.read(path, load, load.items))
        finally:
            self._release()
        done: Future[None] = Future()
        done.set_result(None)
        return done

    # -- choosing the checkpoint -----------------------------------------------------------

    def _choose(self) -> _Chosen:
        """The coordinator's one request: step, lease and every copy; then `.metadata`, or
        (without `step`) the next older step when no copy of it verifies."""
        start = self._start(self.step)
        if start is None:
            raise NotFoundError(
                404,
                "no_restorable_checkpoint",
                f"job {self.job!r} has no restorable checkpoint"
                + (f" on tier {self.tier!r}" if self.tier else ""),
            )
        while True:
            try:
                files = self._files(start.checkpoint, start.tiers)
                raw = files.read_all(METADATA_FILE)
                metadata = pickle.loads(raw)
                if not isinstance(metadata, Metadata):
                    raise TierpointError(
                        f"{self.job}/{start.step}: {METADATA_FILE} is not DCP metadata"
                    )
                return _Chosen(start.step, metadata, files, start.lease.id, start, raw)
            except NoVerifiedCopyError as e:
                self.client.release_lease(self.job, start.step, start.lease.id)
                if self.step is not None:
                    raise
                older = self._older(start.step)
                if older is None:
                    raise
                warnings.warn(
                    f"tierpoint: {e}; loading the next older restorable step {older.step} instead",
                    stacklevel=2,
                )
                start = older

    def _start(self, step: int | None) -> RestoreStart | None:
        # The node counts only where the server chooses the step (a given step needs no node).
        node = self.node if step is None else None
        return self.client.start_restore(
            self.job, self.lease_ttl, step=step, tier=self.tier, node=node, owner=self._owner()
        )

    def _older(self, step: int) -> RestoreStart | None:
        """The newest restorable step before `step` that can still be leased, started."""
        steps = sorted(
            (
                cp.step
                for cp in self.client.checkpoints(self.job, state="restorable", tier=self.tier)
                if cp.step < step
            ),
            reverse=True,
        )
        for candidate in steps:
            try:
                return self._start(candidate)
            except ConflictError:
                continue  # expired or quarantined since it was listed
        return None

    def _files(
        self,
        checkpoint: Checkpoint,
        tiers: Sequence[TierInfo],
        keep: frozenset[str] = frozenset(),
    ) -> CheckpointFiles:
        report = functools.partial(self._report_corrupt, checkpoint.step)
        # Sent to peers' data endpoints; a rank without a client of its own has the coordinator's
        # environment.
        token = (
            self._client.token if self._client is not None else os.environ.get("TIERPOINT_TOKEN")
        )
        return CheckpointFiles(
            checkpoint,
            tiers,
            node=self.node,
            tier=self.tier,
            options=self.options,
            report=report,
            keep=keep,
            token=token,
        )

    def _rank_files(self, plan: LoadPlan) -> CheckpointFiles:
        """This rank's sources: its own (the coordinator's, or a load without collectives), or
        those the coordinator sent with the plan."""
        chosen = self.chosen
        if chosen is None:
            raise TierpointError("read_data before read_metadata")
        sources = plan.storage_data
        if chosen.files is None:
            if not isinstance(sources, _RankSources):
                raise TierpointError("the load plan came without the sources of its files")
            chosen.files = self._files(sources.checkpoint, sources.tiers, sources.keep)
        elif isinstance(sources, _RankSources):
            chosen.files.allow_keeping(sources.keep)  # the coordinator's own files
        return chosen.files

    def _owner(self) -> str:
        group = self.process_group
        ranks = dist.get_world_size(group) if dist.is_available() and dist.is_initialized() else 1
        return f"dcp-load of {ranks} rank(s), coordinator {socket.gethostname()} pid {os.getpid()}"

    def _report_corrupt(self, step: int, entry: PlanEntry, reason: str) -> None:
        """Tell the server, so that it stops handing out the copy; never fails the load."""
        try:
            self.client.report_corrupt_copy(self.job, step, entry.tier, entry.path, reason)
        except TierpointError as e:
            warnings.warn(
                f"tierpoint: could not report the corrupt copy of {self.job}/{step} {entry.path} "
                f"on tier {entry.tier} to the server: {e}",
                stacklevel=2,
            )

    def _release(self) -> None:
        """Every rank's last step of a load, whether its reads succeeded or not: the coordinator
        releases the load's lease once every rank is done with it."""
        if self._collective:
            self._collective = False
            dist.barrier(group=self.process_group)
        self._drop_lease()

    def _drop_lease(self) -> None:
        chosen = self.chosen
        if chosen is not None and chosen.lease_id is not None:
            lease_id, chosen.lease_id = chosen.lease_id, None
            self.client.release_lease(self.job, chosen.step, lease_id)


def _global(group: Any, rank: int) -> int:
    return rank if group is None else dist.get_global_rank(group, rank)
