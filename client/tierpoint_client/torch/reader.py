"""`TierpointReader`: a DCP StorageReader that loads the latest restorable checkpoint of a job (or
a given step) from the fastest verified copy of each file, under a restore lease."""

from __future__ import annotations

import functools
import os
import pickle
import socket
import warnings
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner, ReadItem
from torch.distributed.checkpoint.storage import StorageReader
from torch.futures import Future

from tierpoint_client.client import Client
from tierpoint_client.errors import ConflictError, NotFoundError, TierpointError
from tierpoint_client.models import Checkpoint, PlanEntry, TierInfo
from tierpoint_client.torch._files import (
    METADATA_FILE,
    SCHEME,
    TierpointStorageInfo,
    parse_checkpoint_id,
    resolve_node,
)
from tierpoint_client.torch._load import FileLoad
from tierpoint_client.torch._sources import (
    CheckpointFiles,
    NoVerifiedCopyError,
    ReadOptions,
    ReadStats,
)


@dataclass
class _Chosen:
    step: int
    metadata: Metadata
    checkpoint: Checkpoint  # with its shards and replicas: where every copy of every file is
    tiers: list[TierInfo]
    files: CheckpointFiles
    lease_id: int | None


class TierpointReader(StorageReader):
    """Load `job` (its latest restorable step, or `step`) with `dcp.load`.

    The coordinator (rank 0 of `process_group`, the default group when torch.distributed is
    initialised) chooses the step, reads and verifies `.metadata` and passes it to the other
    ranks, so every rank loads the same step. Each rank holds its own restore lease until its reads
    are done and reads only the files its load plan needs, each from the first verified source: this
    node's local tier (with `node`, or TIERPOINT_NODE), then the shared tier, then S3; `tier`
    restricts the sources to one tier. A copy that fails verification is reported with a warning
    and to the server (`Client.report_corrupt_copy`), and the next one is read. If no copy of the
    newest step's `.metadata` verifies, the reader warns and loads the next older restorable step
    (unless `step` was given).

    With `repopulate`, every file a rank read whole from elsewhere is also written to this node's
    local tier (where the writer would have put it), so a restart on this node reads it locally;
    such a copy is a cache the catalog does not know of, read only after it verifies. S3 files of
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

    @property
    def checkpoint_id(self) -> str:
        step = self.chosen.step if self.chosen is not None else self.step
        return f"{SCHEME}{self.job}" + (f"/{step}" if step is not None else "")

    @property
    def stats(self) -> ReadStats:
        """What this rank read, and from where (empty before a load)."""
        return self.chosen.files.stats if self.chosen is not None else ReadStats()

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
        self._release()
        self.chosen = None

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return parse_checkpoint_id(checkpoint_id) is not None

    def read_metadata(self, *args: Any) -> Metadata:
        # No **kwargs: DCP would retry a failed read as per-rank metadata, which we never write.
        group = self.process_group
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
            self.chosen = self._choose()
        elif dist.get_rank(group) == 0:
            payload: list[Any]
            try:
                self.chosen = self._choose()
                c = self.chosen
                payload = [("ok", c.step, c.metadata, c.checkpoint, c.tiers)]
            except Exception as e:
                # The other ranks wait in the broadcast: they must hear of the failure too.
                dist.broadcast_object_list([("error", repr(e))], src=_global(group, 0), group=group)
                raise
            dist.broadcast_object_list(payload, src=_global(group, 0), group=group)
        else:
            received: list[Any] = [None]
            dist.broadcast_object_list(received, src=_global(group, 0), group=group)
            message = received[0]
            if message[0] != "ok":
                raise TierpointError(f"the coordinator could not choose a checkpoint: {message[1]}")
            _, step, metadata, checkpoint, tiers = message
            lease = self.client.create_lease(self.job, step, self.lease_ttl, holder=_holder())
            files = self._files(checkpoint, tiers)
            self.chosen = _Chosen(step, metadata, checkpoint, tiers, files, lease.id)
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
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        if self.chosen is None:
            raise TierpointError("read_data before read_metadata")
        per_file: dict[str, list[ReadItem]] = {}
        for item in plan.items:
            per_file.setdefault(self.storage_data[item.storage_index].path, []).append(item)
        try:
            for path, items in per_file.items():
                infos = [self.storage_data[i.storage_index] for i in items]
                crcs = {(s.offset, s.length): s.item_crc32c for s in infos}
                # Tensors are read straight into their targets where their layouts allow;
                # DCP gets them (commit_tensor, load_bytes) only once the whole file verified.
                load = FileLoad(planner, items, infos)
                load.finish(self.chosen.files.read(path, list(crcs), crcs, into=load))
        finally:
            self._release()
        done: Future[None] = Future()
        done.set_result(None)
        return done

    # -- choosing the checkpoint -----------------------------------------------------------

    def _choose(self) -> _Chosen:
        client = self.client
        tiers = client.tiers()
        if self.step is not None:
            step = self.step
            lease_id: int | None = client.create_lease(
                self.job, step, self.lease_ttl, holder=_holder()
            ).id
        else:
            latest = client.latest(
                self.job, tier=self.tier, node=self.node, lease_ttl=self.lease_ttl, holder=_holder()
            )
            if latest is None:
                raise NotFoundError(
                    404,
                    "no_restorable_checkpoint",
                    f"job {self.job!r} has no restorable checkpoint"
                    + (f" on tier {self.tier!r}" if self.tier else ""),
                )
            step = latest.step
            lease_id = latest.lease.id if latest.lease is not None else None
        while True:
            try:
                checkpoint = client.checkpoint(self.job, step)
                files = self._files(checkpoint, tiers)
                raw = files.read(METADATA_FILE)[(0, files.sizes[METADATA_FILE][0])]
                metadata = pickle.loads(raw)
                if not isinstance(metadata, Metadata):
                    raise TierpointError(f"{self.job}/{step}: {METADATA_FILE} is not DCP metadata")
                return _Chosen(step, metadata, checkpoint, tiers, files, lease_id)
            except NoVerifiedCopyError as e:
                if lease_id is not None:
                    client.release_lease(self.job, step, lease_id)
                if self.step is not None:
                    raise
                older, lease_id = self._older(step)
                if older is None:
                    raise
                warnings.warn(
                    f"tierpoint: {e}; loading the next older restorable step {older} instead",
                    stacklevel=2,
                )
                step = older

    def _older(self, step: int) -> tuple[int | None, int | None]:
        """The newest restorable step before `step` that can still be leased, with its lease."""
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
                lease = self.client.create_lease(
                    self.job, candidate, self.lease_ttl, holder=_holder()
                )
            except ConflictError:
                continue  # expired or quarantined since it was listed
            return candidate, lease.id
        return None, None

    def _files(self, checkpoint: Checkpoint, tiers: list[TierInfo]) -> CheckpointFiles:
        report = functools.partial(self._report_corrupt, checkpoint.step)
        return CheckpointFiles(
            checkpoint, tiers, node=self.node, tier=self.tier, options=self.options, report=report
        )

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
        chosen = self.chosen
        if chosen is not None and chosen.lease_id is not None:
            self.client.release_lease(self.job, chosen.step, chosen.lease_id)
            chosen.lease_id = None


def _global(group: Any, rank: int) -> int:
    return rank if group is None else dist.get_global_rank(group, rank)


def _holder() -> str:
    return f"dcp-load {socket.gethostname()} pid {os.getpid()}"
