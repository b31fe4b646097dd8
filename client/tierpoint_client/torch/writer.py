"""`TierpointWriter`: a DCP StorageWriter that writes each rank's files to its node's local tier
and registers the whole checkpoint once, from the coordinator's `finish`."""

from __future__ import annotations

import dataclasses
import io
import os
import pickle
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItemType
from torch.distributed.checkpoint.storage import StorageWriter, WriteResult
from torch.futures import Future

from tierpoint_client.client import Client
from tierpoint_client.errors import (
    ConflictError,
    NotFoundError,
    SaveMismatchError,
    TierpointError,
)
from tierpoint_client.hashing import combine, crc32c_hex, update
from tierpoint_client.models import ShardSpec
from tierpoint_client.paths import validate_job_name
from tierpoint_client.timeline import CheckpointRef, step_dir
from tierpoint_client.torch import _run
from tierpoint_client.torch._files import (
    METADATA_FILE,
    SCHEME,
    AtomicFile,
    TierpointStorageInfo,
    local_tier,
    parse_checkpoint_id,
    resolve_node,
)


class TierpointWriter(StorageWriter):
    """Save a DCP checkpoint as `job`/`step` of tierpoint.

    Every rank writes one file, `__<rank>_0.distcp`, under its own node's local-tier root
    (`<root>/<job>/<step>/`; `<step>.b<branch>/` on a branch after a rollback), computing its
    crc32c while writing. The coordinator's `finish` writes DCP's `.metadata` next to its own
    file and registers every file (with its node, size and crc32c) in one request; tierpoint
    then copies the checkpoint to the shared tier and S3. DCP calls `finish` only when every
    rank's `write_data` succeeded, so a failed save registers nothing.

    The checkpoint records its parent: `parent`, else the checkpoint this process's run loaded
    with `TierpointReader` (then the one it saved last), else none (the server takes the step
    before it on the job's timeline). It is saved on `branch`, else the branch that load
    answered (its rollback's, with `rollback`), else the job's current one. `provenance`:
    `config_hash`, `code_version`, `data_cursor`.
    """

    def __init__(
        self,
        job: str,
        step: int,
        *,
        client: Client | None = None,
        node: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        branch: int | None = None,
        parent: CheckpointRef | None = None,
        provenance: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        # Files go to <root>/<job>/<step>/ before the server sees the name: refuse what it would.
        self.job = validate_job_name(job)
        self.step = int(step)
        self._client = client
        self._node = node
        self.metadata = dict(metadata or {})
        self.provenance = dict(provenance) if provenance is not None else None
        # Taken now, in the process that made the writer (DCP may save from another).
        run = _run.point(self.job)
        self.parent = parent if parent is not None else run.parent
        self.branch = branch if branch is not None else run.branch
        self._step_dir: str | None = None
        self.save_id = uuid.uuid4().hex
        self.is_coordinator = False
        self.rank: int | None = None
        self.registered: dict[str, Any] | None = None
        self._root: Path | None = None

    @property
    def checkpoint_id(self) -> str:
        return f"{SCHEME}{self.job}/{self.step}"

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = Client.from_env()
        return self._client

    @property
    def node(self) -> str:
        node = resolve_node(self._node, required=True)
        assert node is not None
        return node

    def directory(self) -> Path:
        if self._root is None:
            # Saves without collectives: one tier lookup per writer, not one per file.
            self._root = _root_of(_local_root_template(self.client), self.node)
        return self._root / self.job / (self._step_dir or step_dir(self.step, self.branch or 1))

    # -- StorageWriter ---------------------------------------------------------------------

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        parsed = parse_checkpoint_id(checkpoint_id)
        if parsed is not None:
            self.job = parsed[0]
            if parsed[1] is not None:
                self.step = parsed[1]
        self.save_id = uuid.uuid4().hex
        self.registered = None

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        parsed = parse_checkpoint_id(checkpoint_id)
        return parsed is not None and parsed[1] is not None

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=self.checkpoint_id, save_id=self.save_id)

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.is_coordinator = is_coordinator
        rank = kwargs.get("rank")
        self.rank = int(rank) if rank is not None else None

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        # What this rank is about to save travels to the coordinator with its plan.
        return dataclasses.replace(plan, storage_data=_RankIntent(self.job, self.step))

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        self._refuse_disagreeing_ranks(plans)
        self._refuse_registered_step()
        self._choose_branch()
        # The coordinator alone asks the server for the tiers and hands every rank the local
        # tier's root and the checkpoint's directory with its plan: the API's work per save does
        # not grow with the ranks.
        root = _local_root_template(self.client)
        # guard: writer-branch-directory
        directory = step_dir(self.step, self.branch or 1)
        self._step_dir = directory
        # The coordinator names every rank's file, so no two ranks can pick the same name.
        return [
            dataclasses.replace(p, storage_data=_RankPlan(f"__{i}_", root, directory))
            for i, p in enumerate(plans)
        ]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        planned = plan.storage_data
        if isinstance(planned, _RankPlan):
            prefix = planned.prefix
            self._root = _root_of(planned.root, self.node)
            self._step_dir = planned.directory
        else:
            # Saves without collectives plan on each rank alone: the rank names its file.
            prefix = f"__{self.rank if self.rank is not None else 0}_"
        results: list[WriteResult] = []
        if plan.items:
            results = self._write_file(f"{prefix}0.distcp", plan, planner)
        done: Future[list[WriteResult]] = Future()
        done.set_result(results)
        return done

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        node = self.node
        storage: dict[Any, TierpointStorageInfo] = {}
        files: dict[str, ShardSpec] = {}
        for rank_results in results:
            for r in rank_results:
                info = r.storage_data
                if not isinstance(info, TierpointStorageInfo):
                    raise TierpointError(f"a rank's write result is not ours: {info!r}")
                storage[r.index] = info
                files[info.path] = ShardSpec(info.path, info.file_size, info.crc32c, info.node)
        metadata.storage_data = storage
        directory = self.directory()
        directory.mkdir(parents=True, exist_ok=True)
        out = AtomicFile(directory / METADATA_FILE)
        try:
            out.write(pickle.dumps(metadata))
            size, crc = out.commit()
        except BaseException:
            out.abort()
            raise
        shards = [*files.values(), ShardSpec(METADATA_FILE, size, crc, node)]
        self.registered = self.client.register_manifest(
            self.job,
            self.step,
            shards,
            metadata=self.metadata,
            branch=self.branch,
            parent=self.parent,
            provenance=self.provenance,
        )
        # The next save of this run descends from this one.
        branch = int(self.registered.get("branch") or self.branch or 1)
        saved = CheckpointRef(self.job, self.step, branch, self.registered.get("id"))
        _run.saved(self.job, saved, branch)

    # -- writing ---------------------------------------------------------------------------

    def _refuse_disagreeing_ranks(self, plans: list[SavePlan]) -> None:
        """Every rank must save the coordinator's job and step. A rank that names another step
        would write its file under that step's directory, the coordinator would register its
        own step with that file's name, and the checkpoint would fail on every tier while the
        stray file stayed unregistered. Checked here, on the coordinator before any rank writes:
        DCP then fails the save on every rank and nothing is written or registered."""
        want = _RankIntent(self.job, self.step)
        odd: list[str] = []
        for rank, plan in enumerate(plans):
            intent = plan.storage_data
            if isinstance(intent, _RankIntent):
                if intent != want:
                    odd.append(f"rank {rank} saves {intent.job}/{intent.step}")
            elif plan.usable:
                # A planner that dropped what the rank planned: it cannot be checked.
                odd.append(f"rank {rank}'s plan does not say what it saves ({intent!r})")
            # else: a plan-caching planner's "unchanged" tier copy, which carries nothing.
        if odd:
            raise SaveMismatchError(
                f"the ranks of this save disagree on what they save: the coordinator saves "
                f"{self.job}/{self.step}, {', '.join(odd)}; nothing was written or registered"
            )

    def _refuse_registered_step(self) -> None:
        """A step is written once on the job's timeline: saving it again would overwrite the
        files of a registered checkpoint (DCP's `.metadata` differs on every save) before
        registration refused it. One that a rollback superseded is off the timeline: the step
        is saved again, in its branch's own directory. The coordinator checks before any rank
        writes; DCP fails the save on every rank."""
        try:
            found = self.client.checkpoint(self.job, self.step)
        except NotFoundError:
            return
        # guard: writer-resaves-only-superseded
        if found.superseded_by is not None:
            return
        raise ConflictError(
            409,
            "checkpoint_conflict",
            f"{self.job}/{self.step} is already registered: a step is saved once on a job's "
            f"timeline. To train from an earlier step again, roll back to it: load it with "
            f"TierpointReader({self.job!r}, step=S, rollback=True), or `tierpoint rollback "
            f"{self.job} S`",
        )

    def _choose_branch(self) -> None:
        """The branch of a writer that neither was given one nor follows a load: the job's
        current one (a new job's first, unnamed)."""
        if self.branch is not None:
            return
        try:
            self.branch = self.client.branches(self.job).current
        except NotFoundError:
            self.branch = None  # a job not saved yet: its first branch

    def _write_file(self, name: str, plan: SavePlan, planner: SavePlanner) -> list[WriteResult]:
        node = self.node
        directory = self.directory()
        directory.mkdir(parents=True, exist_ok=True)
        out = AtomicFile(directory / name)
        placed: list[tuple[Any, int, int, str]] = []
        try:
            for item in plan.items:
                data = planner.resolve_data(item)
                offset = out.size
                # Each item's own crc32c as well as the file's lets a reader that needs only
                # this item fetch and verify it alone.
                sink = _ItemSink(out)
                if item.type == WriteItemType.BYTE_IO:
                    if not isinstance(data, io.BytesIO):
                        raise TierpointError(f"{item.index}: bytes item is not a BytesIO")
                    sink.write(data.getbuffer())
                else:
                    _serialize_tensor(data, sink)
                placed.append((item.index, offset, out.size - offset, crc32c_hex(sink.crc)))
            size, crc = out.commit()
        except BaseException:
            out.abort()
            raise
        return [
            WriteResult(
                index=index,
                size_in_bytes=length,
                storage_data=TierpointStorageInfo(name, offset, length, node, size, crc, item_crc),
            )
            for index, offset, length, item_crc in placed
        ]


@dataclass(frozen=True)
class _RankIntent:
    """What a rank adds to its local plan: the checkpoint it is about to save."""

    job: str
    step: int


@dataclass(frozen=True)
class _RankPlan:
    """What the coordinator adds to each rank's save plan."""

    prefix: str  # the rank's file name, less its `0.distcp`
    root: str  # the local tier's root, `{node}` not yet replaced
    directory: str  # the checkpoint's under the job's: `step_dir(step, branch)`


def _local_root_template(client: Client) -> str:
    tier = local_tier(client.tiers())
    if tier is None or tier.root is None:
        raise TierpointError("the tierpoint server has no local tier to write checkpoints to")
    return tier.root


def _root_of(template: str, node: str) -> Path:
    return Path(template.replace("{node}", node))


class _ItemSink:
    """What an item is written through: straight into the rank's file (torch.save writes its
    records here, the tensor's storage as one memoryview of it, so no serialised copy of the
    tensor is ever held in memory), its crc32c computed on the way."""

    def __init__(self, out: AtomicFile) -> None:
        self._out = out
        self.crc = 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
        # Each byte hashed once: the chunk's crc32c goes into the item's and the file's.
        n = memoryview(data).nbytes
        crc = update(0, data)
        self.crc = combine(self.crc, crc, n)
        self._out.write(data, crc)
        return n

    def flush(self) -> None:
        # torch.save flushes its buffer at the end; the file is fsynced once, at commit.
        pass


def _serialize_tensor(data: Any, sink: _ItemSink) -> None:
    if not isinstance(data, torch.Tensor):
        raise TierpointError(f"tensor item resolved to {type(data).__name__}")
    tensor = data.detach().cpu()
    # torch.save writes a view's whole storage: save only the view's elements.
    if tensor.untyped_storage().nbytes() != tensor.numel() * tensor.element_size():
        tensor = tensor.clone()
    if not _save_without_zip_crc32(tensor, sink):
        torch.save(tensor, sink)  # a writable file-like object is all it needs


def _save_without_zip_crc32(tensor: torch.Tensor, sink: _ItemSink) -> bool:
    """torch.save's format, without the zip CRC32 it computes of every record by default (about
    as long as writing the bytes to a local disk): our crc32c of the item and of the file
    already covers every byte, and torch.load does not check the zip CRC. Done per call with
    torch's own writer rather than by `torch.serialization.set_crc32_options(False)`, which is
    process-wide and would change every other torch.save of the training process too. False
    when this torch has not these internals (then torch.save, with its CRC32)."""
    ser = torch.serialization
    try:
        save = ser._save
        writer = torch._C.PyTorchFileWriter(sink, False, ser._get_storage_alignment())
    except (AttributeError, TypeError):
        return False
    save(tensor, writer, pickle, ser.DEFAULT_PROTOCOL, False)
    writer.write_end_of_file()
    return True
