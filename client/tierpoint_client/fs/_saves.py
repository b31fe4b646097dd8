"""A save through `tierpoint://<job>/step-<N>/`: where its files go, the checks made before any
is written, and its commit.

DCP's commit point is the rename of `.metadata.tmp` to `.metadata`, made by the coordinator once
every rank has closed its data files. That rename puts `.metadata` in place as TierpointWriter
writes it (so either reader loads the step) and registers the checkpoint, in one request, with
every file that `.metadata` names (each with the size, crc32c and node its rank recorded, see
_writes) and `.metadata` itself. From then on it is an ordinary checkpoint: tierpoint seals it,
copies it down the tiers, verifies every copy and applies retention, as for TierpointWriter.
"""

from __future__ import annotations

import os
import pickle
import threading
from dataclasses import dataclass
from pathlib import Path

from tierpoint_client.client import Client
from tierpoint_client.errors import ConflictError, NotFoundError, TierpointError
from tierpoint_client.fs import _writes
from tierpoint_client.fs._config import Settings, client_for
from tierpoint_client.fs._paths import FsPath
from tierpoint_client.models import ShardSpec
from tierpoint_client.torch._files import (
    METADATA_FILE,
    AtomicFile,
    fsync_dir,
    local_tier,
    stored_items,
)


@dataclass(frozen=True)
class Save:
    """A step this process is writing and has not committed."""

    job: str
    step: int
    directory: Path  # <local root>/<job>/<step>/ on this node, as TierpointWriter writes it
    node: str


_lock = threading.Lock()
_saves: dict[tuple[str, int], Save] = {}
_roots: dict[str, str] = {}  # API URL -> the local tier's root, `{node}` not yet replaced


def saving(job: str, step: int) -> Save | None:
    with _lock:
        return _saves.get((job, step))


def begin(settings: Settings, path: FsPath) -> Save:
    """The save of `path`'s step, started on its first makedirs or open for writing. On the
    coordinator (rank 0, or a process without torch.distributed) the step is checked first: the
    token may write the job and the step is not registered. DCP makes that check, made while it
    plans the save, fail the save on every rank before any rank writes. The coordinator then
    hands the local tier's root to the other ranks, which ask the server nothing."""
    assert path.step is not None
    found = saving(path.job, path.step)
    if found is not None:
        return found
    client = client_for(settings)
    node = settings.require_node()
    if _writes.is_coordinator():
        try:
            # guard: fs-step-saved-once
            _refuse_registered(client, path.job, path.step)
            root = _root(client, settings)
        except BaseException:
            # The other ranks wait for the root: they must not wait in vain (they ask the server
            # themselves; DCP fails the save with this error on every rank).
            _writes.publish_root(path.job, path.step, None)
            raise
        _writes.publish_root(path.job, path.step, root)
    else:
        root = _root(client, settings, (path.job, path.step))
    # Created by the first file written: a save that fails while DCP plans it leaves nothing.
    directory = Path(root.replace("{node}", node)) / path.job / str(path.step)
    save = Save(path.job, path.step, directory, node)
    with _lock:
        return _saves.setdefault((path.job, path.step), save)


def on_written(save: Save, name: str) -> _Recorder:
    return _Recorder(save, name)


class _Recorder:
    """What a staged file calls once it is in place."""

    def __init__(self, save: Save, name: str) -> None:
        self.save, self.name = save, name

    def __call__(self, size: int, crc: str) -> None:
        rec = _writes.FileRecord(size, crc, self.save.node)
        _writes.record(self.save.job, self.save.step, self.name, rec)


def rename(settings: Settings, save: Save, src: str, dst: str) -> None:
    """Rename a file of the save on this node; renaming it to `.metadata` commits the save."""
    if dst == METADATA_FILE:
        commit(client_for(settings), save, src)
        return
    rec = _writes.lookup(save.job, save.step, src)
    target = save.directory / dst
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(save.directory / src, target)
    fsync_dir(target.parent)
    _writes.forget(save.job, save.step, src)
    _writes.record(save.job, save.step, dst, rec)


def remove(save: Save, name: str) -> None:
    """A file of the save that DCP removes (a write that failed): gone, and not registered."""
    (save.directory / name).unlink(missing_ok=True)
    _writes.forget(save.job, save.step, name)


def commit(client: Client, save: Save, staged: str) -> None:
    """DCP's commit, `staged` (its `.metadata.tmp`) becoming `.metadata`. What DCP wrote there
    records each item by file, offset and length only; `.metadata` records it as TierpointWriter
    does, with its file's node, size and crc32c (every rank's record, from the store), so that
    TierpointReader loads the step as well as a load by URL does. Then the checkpoint is
    registered with every file `.metadata` names, and `.metadata`."""
    where = f"{save.job}/step-{save.step}"
    metadata = pickle.loads((save.directory / staged).read_bytes())  # written a moment ago
    files: dict[str, _writes.FileRecord] = {}

    def file_of(name: str) -> tuple[str, int, str]:
        rec = files[name] = files.get(name) or _writes.lookup(save.job, save.step, name)
        return rec.node, rec.size, rec.crc32c

    # An error here fails the save before anything is registered.
    metadata.storage_data = stored_items(getattr(metadata, "storage_data", None), file_of, where)
    out = AtomicFile(save.directory / METADATA_FILE)
    try:
        out.write(pickle.dumps(metadata))
        size, crc = out.commit()
    except BaseException:
        out.abort()
        raise
    remove(save, staged)
    _writes.record(save.job, save.step, METADATA_FILE, _writes.FileRecord(size, crc, save.node))
    _register(client, save, [*sorted(files), METADATA_FILE])


def commit_written(client: Client, save: Save) -> None:
    """An fsspec transaction's commit (Lightning's save): the files this process wrote."""
    _register(client, save, sorted(_writes.names(save.job, save.step)))


def abandon(save: Save) -> None:
    """A save whose files were all discarded: nothing of it stays staged or recorded."""
    with _lock:
        _saves.pop((save.job, save.step), None)
    _writes.forget_step(save.job, save.step)


def _register(client: Client, save: Save, names: list[str]) -> None:
    shards = []
    for name in names:
        rec = _writes.lookup(save.job, save.step, name)
        shards.append(ShardSpec(name, rec.size, rec.crc32c, rec.node))
    abandon(save)
    client.register_manifest(save.job, save.step, shards)


def _refuse_registered(client: Client, job: str, step: int) -> None:
    """A token that may not register the job's checkpoints (a `read` token, another job's) is
    refused (403) by the registration's own rule. A step is saved once (DCP would overwrite a
    registered checkpoint's files before the registration refused it)."""
    # guard: fs-save-authorized
    client.authorize_registration(job)
    try:
        client.checkpoint(job, step)
    except NotFoundError:
        return
    raise ConflictError(
        409,
        "checkpoint_conflict",
        f"{job}/step-{step} is already registered: a step is saved once",
    )


def _root(client: Client, settings: Settings, save: tuple[str, int] | None = None) -> str:
    """The local tier's root, asked of the server once per process and API. A rank other than
    the coordinator first takes the one the coordinator handed over for the save `save` (through
    torch.distributed's store): a save then costs no request per rank, at any world size."""
    key = settings.api_url or ""
    with _lock:
        found = _roots.get(key)
    if found is None and save is not None:
        found = _writes.published_root(*save)
    if found is None:
        tier = local_tier(client.tiers())
        if tier is None or tier.root is None:
            raise TierpointError("the tierpoint server has no local tier to write checkpoints to")
        found = tier.root
    with _lock:
        _roots.setdefault(key, found)
    return found
