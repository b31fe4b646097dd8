"""`TierpointReader`: a DCP StorageReader that loads the latest restorable checkpoint of a job (or
a given step, the newest of a branch, the newest certified good) from the fastest verified copy
of each file, under one restore lease per load."""

from __future__ import annotations

import dataclasses
import functools
import os
import socket
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner, ReadItem
from torch.distributed.checkpoint.storage import StorageReader
from torch.futures import Future

from tierpoint_client._fallback import report_stripe
from tierpoint_client.client import Client
from tierpoint_client.errors import NotFoundError, TierpointError
from tierpoint_client.models import Checkpoint, PlanEntry, TierInfo
from tierpoint_client.timeline import Loaded
from tierpoint_client.torch import _run
from tierpoint_client.torch._choose import Choice, Chosen, choose
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

    `branch=N` loads the newest checkpoint of branch N's own timeline; `health="good"` the newest
    certified good (walking back across tiers and branches). With `rollback`, a load of a step
    that the job's timeline goes on past rolls the job back to it (a new branch; the steps after
    it superseded, never deleted), so the run saves them again. What was loaded (`loaded`) is
    the parent of the job's next `TierpointWriter` save in this process, and the branch it saves
    on. A job's first run has nothing to load: `load(state)` then returns None (plain `dcp.load`
    raises DCP's CheckpointException, a BaseException, quoting `no_restorable_checkpoint`).
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
        branch: int | None = None,
        health: Literal["good"] | None = None,
        rollback: bool = False,
    ) -> None:
        super().__init__()
        self.job = job
        self.step = step
        self.branch = branch
        self.health = health
        self.rollback = rollback
        # Nothing was restorable (every rank knows it): `load` then returns None.
        self.found_nothing = False
        self._prechosen = False
        self._client = client
        self.node = resolve_node(node, required=False)
        self.tier = tier
        self.lease_ttl = lease_ttl
        self.process_group = process_group
        self.options = ReadOptions(repopulate=repopulate, min_ranged_size=min_ranged_size)
        self._choice()  # refuse options that contradict each other before any request
        self.chosen: Chosen | None = None
        self.storage_data: dict[Any, TierpointStorageInfo] = {}
        # Whether this load's ranks coordinate through collectives (every rank alike).
        self._collective = False

    @property
    def checkpoint_id(self) -> str:
        step = self.chosen.step if self.chosen is not None else self.step
        return f"{SCHEME}{self.job}" + (f"/{step}" if step is not None else "")

    @property
    def loaded(self) -> Loaded | None:
        """The checkpoint the last load read (every rank), with its writer's metadata."""
        return self.chosen.loaded if self.chosen is not None else None

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
        self.found_nothing = False
        self._prechosen = False

    def load(self, state_dict: dict[str, Any], *, planner: Any = None) -> int | None:
        """`dcp.load(state_dict, storage_reader=self)` for a run that may be the job's first:
        the step loaded, or None when the job has nothing to load (`state_dict` untouched, no
        exception: start from scratch). Every rank calls it and gets the same answer."""
        self.reset()
        if not self._coordinate():
            return None
        self._prechosen = True
        dcp.load(state_dict, storage_reader=self, planner=planner, process_group=self.process_group)
        assert self.chosen is not None
        return self.chosen.step

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return parse_checkpoint_id(checkpoint_id) is not None

    def read_metadata(self, *args: Any) -> Metadata:
        # No **kwargs: DCP would retry a failed read as per-rank metadata, which we never write.
        if not self._prechosen and not self._coordinate():
            raise self._nothing()
        self._prechosen = False
        assert self.chosen is not None
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
        transformed = sorted(
            {i.path for i in metadata.storage_data.values() if i.transform_descriptors}
        )
        if transformed:
            raise TierpointError(
                f"{self.checkpoint_id}: {', '.join(transformed)} hold items stored through "
                "DCP's storage extensions, which TierpointReader does not undo; load it by "
                "URL (dcp.load(state, checkpoint_id='tierpoint://<job>/step-<N>'))"
            )
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

    def _choice(self) -> Choice:
        return Choice(
            self.job, self.step, self.branch, self.health, self.tier, self.node, self.lease_ttl
        )

    def _nothing(self) -> NotFoundError:
        self.found_nothing = True
        what = self._choice().describe()
        return NotFoundError(404, "no_restorable_checkpoint", f"{what}: no restorable checkpoint")

    def _coordinate(self) -> bool:
        """The coordinator chooses the checkpoint and tells every rank which (its metadata
        only: each rank's sources go with its load plan), or that there is none (False). What
        was loaded is recorded for the process's next save of the job (`_run`)."""
        group = self.process_group
        self._collective = False
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
            self.chosen = self._choose()
        elif dist.get_rank(group) == 0:
            self._collective = True
            try:
                self.chosen = self._choose()
            except Exception as e:
                # The other ranks wait in the broadcast: they must hear of the failure too.
                word = "none" if self.found_nothing else "error"
                dist.broadcast_object_list([(word, repr(e))], src=_global(group, 0), group=group)
                raise
            c = self.chosen
            payload = [("ok", c.step, c.metadata, c.loaded, c.branch)] if c else [("none", "")]
            dist.broadcast_object_list(payload, src=_global(group, 0), group=group)
        else:
            self._collective = True
            received: list[Any] = [None]
            dist.broadcast_object_list(received, src=_global(group, 0), group=group)
            message = received[0]
            if message[0] == "none":
                self.found_nothing = True
            elif message[0] != "ok":
                raise TierpointError(f"the coordinator could not choose a checkpoint: {message[1]}")
            else:
                _, step, metadata, loaded, branch = message
                self.chosen = Chosen(step, metadata, None, None, loaded=loaded, branch=branch)
        if self.chosen is None:
            return False
        if self.chosen.loaded is not None:
            branch = self.chosen.branch
            _run.loaded(self.job, self.chosen.loaded.ref, branch.number if branch else None)
        return True

    def _choose(self) -> Chosen | None:
        chosen = choose(
            self.client, self._choice(), self._owner(), self._files, rollback=self.rollback
        )
        self.found_nothing = chosen is None
        return chosen

    def _files(
        self,
        checkpoint: Checkpoint,
        tiers: Sequence[TierInfo],
        keep: frozenset[str] = frozenset(),
    ) -> CheckpointFiles:
        # Reported against the checkpoint read, by its own job and branch: a fork's first load
        # reads its parent's files, and a step may be saved on several branches.
        report = functools.partial(self._report_corrupt, checkpoint)
        stripe = functools.partial(self._report_stripe, checkpoint)
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
            report_stripe=stripe,
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

    def _report_corrupt(self, checkpoint: Checkpoint, entry: PlanEntry, reason: str) -> None:
        """Tell the server, so that it stops handing out the copy; never fails the load."""
        # guard: reader-reports-on-the-checkpoint-read
        job, step = checkpoint.job, checkpoint.step
        try:
            self.client.report_corrupt_copy(
                job, step, entry.tier, entry.path, reason, branch=checkpoint.branch
            )
        except TierpointError as e:
            warnings.warn(
                f"tierpoint: could not report the corrupt copy of {job}/{step} {entry.path} "
                f"on tier {entry.tier} to the server: {e}",
                stacklevel=2,
            )

    def _report_stripe(
        self, checkpoint: Checkpoint, entry: PlanEntry, index: int, why: str
    ) -> None:
        """A stripe the load read around because its bytes did not match: reported as the
        restore reports one (its holder reads it back before the server believes it)."""
        job, step, branch = checkpoint.job, checkpoint.step, checkpoint.branch
        report_stripe(self.client, job, step, branch, entry, index, f"load read {why}")

    def _release(self) -> None:
        """Every rank's last step of a load, whether its reads succeeded or not: the coordinator
        releases the load's lease once every rank is done with it."""
        if self._collective:
            self._collective = False
            dist.barrier(group=self.process_group)
        self._drop_lease()

    def _drop_lease(self) -> None:
        if self.chosen is not None:
            self._drop_lease_of(self.chosen)

    def _drop_lease_of(self, chosen: Chosen) -> None:
        if chosen.lease_id is not None:
            lease_id, chosen.lease_id = chosen.lease_id, None
            # The checkpoint's own job: a fork's first load leases its parent's.
            job = chosen.start.job if chosen.start is not None else self.job
            self.client.release_lease(job, chosen.step, lease_id)


def _global(group: Any, rank: int) -> int:
    return rank if group is None else dist.get_global_rank(group, rank)
