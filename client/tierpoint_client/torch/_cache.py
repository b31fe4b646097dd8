"""This node's local tier as a cache of what a load read elsewhere: this node's own files put back
in place, and other nodes' files kept, once the server has recorded them (so that the expiry of
the checkpoint's copy on the local tier deletes them: a rank keeps only what the server recorded).

The coordinator records, for every rank in one request before any rank writes one, the files each
node will keep (`record_kept`); each rank then writes a file it read whole as it reads it
(`LocalTier.copying`), committed only when the whole file verified."""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tierpoint_client.api import Api
from tierpoint_client.errors import TierpointError
from tierpoint_client.models import PlanEntry, RestoreStart, Shard, TierInfo
from tierpoint_client.torch._files import METADATA_FILE, AtomicFile, local_tier


@dataclass(frozen=True)
class RankNode:
    """What a rank tells the coordinator with its local plan: where it may keep files."""

    node: str | None
    repopulate: bool


def record_kept(
    api: Api,
    start: RestoreStart,
    ranks: Sequence[RankNode | None],
    reads: Sequence[set[str]],
    *,
    coordinator: str | None,
) -> dict[str, set[str]]:
    """Record the other nodes' files each rank (`ranks[i]`, reading `reads[i]`) may keep on its
    node: every file it reads that is not its node's own, and `.metadata` on the `coordinator`'s
    node (None: it keeps nothing). Returns node -> the files recorded; nothing when there is
    nothing to keep, or when the server cannot be asked (the load goes on without keeping)."""
    local = local_tier(start.tiers)
    if local is None or local.root is None:
        return {}
    owner = {s.path: s.node for s in start.checkpoint.shards or ()}
    wanted: dict[str, set[str]] = {}
    for rank, paths in zip(ranks, reads, strict=True):
        if rank is not None and rank.node is not None and rank.repopulate:
            theirs = {p for p in paths if owner.get(p) != rank.node}
            wanted.setdefault(rank.node, set()).update(theirs)
    if coordinator is not None and owner.get(METADATA_FILE) != coordinator:
        wanted.setdefault(coordinator, set()).add(METADATA_FILE)
    wanted = {n: p for n, p in wanted.items() if p}
    if not wanted:
        return {}
    try:
        return api.record_cached_copies(start.job, start.step, local.name, wanted)
    except TierpointError as e:
        warnings.warn(
            f"tierpoint: could not record the files this load keeps on its nodes ({e}); "
            "they are read but not kept",
            stacklevel=3,
        )
        return {}


class LocalCopy:
    """A file being written to this node's local tier as it is read (a `sources.Sink`): a copy
    that cannot be written is dropped with a warning and never fails the read."""

    def __init__(self, file: AtomicFile) -> None:
        self._file: AtomicFile | None = file
        self.committed = False

    def write(self, data: bytes | bytearray | memoryview, crc: int | None = None) -> None:
        if self._file is None:
            return
        try:
            self._file.write(data, crc)
        except OSError as e:
            self._give_up(e)

    def commit(self) -> None:
        """Put the copy in place (the read verified: its bytes are the file's): `committed`."""
        if self._file is None:
            return
        try:
            self._file.commit()
        except OSError as e:
            self._give_up(e)
            return
        self._file = None
        self.committed = True

    def abort(self) -> None:
        if self._file is not None:
            self._file.abort()
            self._file = None

    def _give_up(self, e: OSError) -> None:
        assert self._file is not None
        warnings.warn(
            f"tierpoint: could not write a local copy to {self._file.final} ({e}); "
            "the load goes on",
            stacklevel=4,
        )
        self.abort()


class LocalTier:
    """Where this node keeps a checkpoint's files on its local tier, and which of them a load may
    write there: the node's own files whose catalog copy here is usable (put back in place if
    missing), and other nodes' files the server recorded as kept here (`allow_keeping`). A file
    the catalog lists here but not as usable (being sealed, failed, expiring) is the server's to
    handle: neither read as a cache nor overwritten."""

    def __init__(
        self,
        job: str,
        step: int,
        tiers: Sequence[TierInfo],
        *,
        node: str | None,
        tier: str | None,
        repopulate: bool,
        keep: frozenset[str] = frozenset(),
    ) -> None:
        local = local_tier(tiers)
        self.name = local.name if local is not None else None
        self.node = node
        self.dir: Path | None = None
        if node is not None and local is not None and local.root is not None:
            self.dir = Path(local.root.replace("{node}", node)) / job / str(step)
        # Whether a cached copy may be read: the local tier is among the tiers read.
        self._usable = local is not None and (tier is None or tier == local.name)
        self._repopulate = repopulate
        self._keep = set(keep)
        self._own: set[str] = set()
        self._not_ours: set[str] = set()

    def cached_copy(self, shard: Shard, usable: Sequence[PlanEntry]) -> PlanEntry | None:
        """The copy of `shard` this node may hold outside the catalog (a cache the reader wrote,
        trusted only once it verifies), to try before `usable` (the catalog's copies this node
        may read); None where the catalog lists a copy at that path (of this node's own file)."""
        mine = self._path(shard.path)
        known = any(_same_file(r.location or "", mine) for r in shard.replicas)
        if known and any(_same_file(e.location, mine) for e in usable):
            self._own.add(shard.path)
        elif known:
            self._not_ours.add(shard.path)
        if mine is None or self.name is None or not self._usable or known:
            return None
        return PlanEntry(
            shard.path, shard.size, shard.crc32c, self.name, "local", self.node, str(mine)
        )

    def allow_keeping(self, paths: frozenset[str]) -> None:
        """Other nodes' files this node may keep on its local tier: those the server recorded
        (`Api.record_cached_copies`), so that the copy's expiry deletes them."""
        self._keep |= paths

    @contextlib.contextmanager
    def copying(self, entry: PlanEntry) -> Iterator[LocalCopy | None]:
        """A new local copy of the file `entry` is a copy of, for the block to write every byte
        of the file to (None: none is written), committed when the block ends, removed if it
        raises. One is made when re-population is on and the read is not of the local copy
        itself: this node's own file put back in place, or another node's that the server
        recorded as kept here; only inside an existing local-tier root."""
        copy = self._new_copy(entry)
        try:
            yield copy
        except BaseException:
            if copy is not None:
                copy.abort()
            raise
        if copy is not None:
            copy.commit()

    def _new_copy(self, entry: PlanEntry) -> LocalCopy | None:
        target = self._path(entry.path)
        allowed = entry.path in self._own or entry.path in self._keep
        if not (self._repopulate and allowed) or target is None or self.dir is None:
            return None
        if _same_file(entry.location, target) or entry.path in self._not_ours:
            return None
        if not self.dir.parent.parent.is_dir():
            return None  # this machine has no local tier mounted: nothing to populate
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            return LocalCopy(AtomicFile(target))
        except OSError as e:
            warnings.warn(
                f"tierpoint: cannot write a local copy to {target} ({e}); the load goes on",
                stacklevel=5,
            )
            return None

    def _path(self, path: str) -> Path | None:
        return None if self.dir is None else self.dir / path


def _same_file(location: str, path: Path | None) -> bool:
    return path is not None and os.path.normpath(location) == os.path.normpath(path)
