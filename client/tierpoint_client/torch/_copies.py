"""A checkpoint's files as a rank reads them: each file from the first of its copies that
verifies, fastest first (this node's kept copy, then the catalog's verified copies; see
`tierpoint_client.sources` for the route of a load and how each copy is read), with this node's
local tier re-populated on the way: the node's own files put back in place, and other nodes'
files kept as a cache once the server has recorded them (torch/_kept.py), so that the copy's
expiry deletes them. A file is written to the local tier as it is read, and committed only when
the whole file verified."""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tierpoint_client.errors import NoVerifiedCopyError, SourceError, TierpointError
from tierpoint_client.models import Checkpoint, PlanEntry, Shard, TierInfo
from tierpoint_client.sources import (
    Mismatch,
    Placement,
    Pread,
    Range,
    Segment,
    Sources,
    ranged_read,
    verified_copies,
)
from tierpoint_client.sources.coded import StripeReport
from tierpoint_client.timeline import step_dir
from tierpoint_client.torch._files import AtomicFile, local_tier

# Reports a copy the catalog lists whose bytes did not verify: (entry, reason).
CorruptReport = Callable[[PlanEntry, str], None]


@dataclass
class ReadStats:
    """What a load read: per file, where from and how (`tier`, `tier (ranged)`, `tier (cache)`);
    the bytes fetched; and the files written to this node's local tier afterwards."""

    files: dict[str, str] = field(default_factory=dict)
    bytes_fetched: int = 0
    repopulated: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ReadOptions:
    repopulate: bool = True
    # Files at least this large are read from S3 in ranges when a rank needs at most half of one.
    min_ranged_size: int = 64 * 1024 * 1024


@dataclass(frozen=True)
class _Copy:
    entry: PlanEntry
    # A file in this node's local-tier directory of the checkpoint that the catalog does not list
    # as this node's copy: a cache the reader wrote, trusted only once it verifies.
    cached: bool = False


class CheckpointFiles:
    """The copies of one checkpoint's files: first this node's local copy (the catalog's, or a
    cached one), then every verified replica on a tier whose copy is restorable, in the tiers'
    configured order (fastest first). A node-local replica is used only on its own node; `tier`
    restricts the copies to that tier."""

    def __init__(
        self,
        checkpoint: Checkpoint,
        tiers: Sequence[TierInfo],
        *,
        node: str | None,
        tier: str | None,
        options: ReadOptions | None = None,
        report: CorruptReport | None = None,
        keep: frozenset[str] = frozenset(),
        token: str | None = None,
        report_stripe: StripeReport | None = None,
    ) -> None:
        """`checkpoint` may list only the files to be read. `keep`: the files of other nodes
        this node may keep on its local tier, as the server recorded them (`allow_keeping`).
        `token` is sent to the data endpoints of peer copies. `report_stripe` is told of each
        stripe of a coded copy read around because its bytes did not match."""
        if checkpoint.shards is None:
            raise TierpointError("the checkpoint was read without its shards")
        self.job, self.step = checkpoint.job, checkpoint.step
        self.options = options or ReadOptions()
        self.stats = ReadStats()
        self._report = report
        self.local = LocalTier(
            self.job,
            step_dir(self.step, checkpoint.branch),
            tiers,
            node=node,
            tier=tier,
            repopulate=self.options.repopulate,
            keep=keep,
        )
        restorable = checkpoint.restorable_tiers()
        verified = verified_copies(checkpoint.shards, restorable, tiers, node, tier)
        self.copies: dict[str, list[_Copy]] = {}
        self.sizes: dict[str, int] = {}
        for shard in checkpoint.shards:
            usable = verified[shard.path]
            found = [_Copy(e) for e in usable]
            cached = self.local.cached_copy(shard, usable)
            if cached is not None:
                found.insert(0, _Copy(cached, cached=True))
            self.copies[shard.path] = found
            self.sizes[shard.path] = shard.size
        self._sources = Sources({t.name: t for t in tiers}, token, report_stripe)

    def read(
        self, path: str, into: Placement, items: Mapping[Range, str | None] | None = None
    ) -> dict[Range, bytearray]:
        """The file, from the first copy that verifies, read into the memory `into` gives ({}
        returned); or only the byte ranges `items` names, each with its crc32c (from
        `.metadata`), where a large S3 copy of which little is needed is read in ranges (their
        bytes returned). A copy that does not verify, or cannot be read, is reported with a
        warning and the next one is tried."""
        if path not in self.copies:
            raise TierpointError(f"{self.job}/{self.step} has no file {path!r}")
        wanted = sorted(items) if items is not None else [(0, self.sizes[path])]
        crcs = {r: c for r, c in (items or {}).items() if c is not None}
        tried: list[str] = []
        for copy in self.copies[path]:
            entry = copy.entry
            if copy.cached and not os.path.exists(entry.location):
                continue  # no cached copy: nothing to warn about
            try:
                source = self._sources.open(entry)
                ranged = ranged_read(source, wanted, crcs, self.options.min_ranged_size)
                if ranged is not None:
                    got, fetched = ranged.read_ranges(wanted, crcs)
                    how = f"{entry.tier} (ranged)"
                else:
                    # A whole read, which also writes every byte to a new local copy where this
                    # node keeps the file (committed only once the file verified).
                    with self.local.copying(entry) as local:
                        source.read_into(into, local)
                    if local is not None and local.committed:
                        self.stats.repopulated.append(path)
                    got, fetched = {}, entry.size
                    how = f"{entry.tier} (cache)" if copy.cached else entry.tier
            except (SourceError, OSError, Mismatch) as e:
                tried.append(f"{entry.tier}: {e}")
                self._failed(copy, e)
                continue
            self.stats.files[path] = how
            self.stats.bytes_fetched += fetched
            return got
        raise NoVerifiedCopyError(self.job, self.step, path, tried)

    def read_all(self, path: str) -> bytes:
        """The whole file, verified (from the first copy that verifies)."""
        whole = _Whole(self.sizes[path])
        self.read(path, whole)
        return bytes(whole.buffer)

    def allow_keeping(self, paths: frozenset[str]) -> None:
        """Other nodes' files this node may keep on its local tier: those the server recorded
        (`Api.record_cached_copies`), so that the copy's expiry deletes them."""
        self.local.allow_keeping(paths)

    def keep(self, path: str, data: bytes) -> None:
        """Write a file already read whole and verified (its bytes `data`) to this node's local
        tier, if it may keep it and it was read from elsewhere."""
        if self.stats.files.get(path) in (self.local.name, f"{self.local.name} (cache)"):
            return  # read here
        entry = next((c.entry for c in self.copies.get(path, ()) if not c.cached), None)
        if entry is None:
            return
        with self.local.copying(entry) as local:
            if local is not None:
                local.write(data)
        if local is not None and local.committed:
            self.stats.repopulated.append(path)

    def _failed(self, copy: _Copy, e: Exception) -> None:
        entry = copy.entry
        corrupt = isinstance(e, Mismatch)
        what = "failed verification" if corrupt else "could not be read"
        kind = " (cached copy)" if copy.cached else ""
        warnings.warn(
            f"tierpoint: {self.job}/{self.step} {entry.path} on tier {entry.tier}{kind} {what} "
            f"({e}); trying the next copy",
            stacklevel=4,
        )
        if not corrupt:
            return
        if copy.cached:
            # Ours, unknown to the catalog: drop it so that the next copy read replaces it.
            with contextlib.suppress(OSError):
                os.unlink(entry.location)
        elif self._report is not None:
            self._report(entry, f"{what} on read: {e}")


class _Whole:
    """A placement of the whole file in one buffer."""

    def __init__(self, size: int) -> None:
        self.buffer = memoryview(bytearray(size))

    def segments(self, pread: Pread) -> list[Segment]:
        return [Segment(0, len(self.buffer), self.buffer)]


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
        directory: str,
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
            # Where the writer puts the checkpoint's files (`step_dir`: the step, on a branch
            # after a rollback `<step>.b<branch>`).
            self.dir = Path(local.root.replace("{node}", node)) / job / directory
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
