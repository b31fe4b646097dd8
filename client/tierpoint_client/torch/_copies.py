"""A checkpoint's files as a rank reads them: each file from the first of its copies that
verifies, fastest first (this node's kept copy, then the catalog's verified copies; see
`tierpoint_client.sources` for the route of a load and how each copy is read), with this node's
local tier re-populated on the way (torch/_cache.py)."""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from tierpoint_client.errors import NoVerifiedCopyError, SourceError, TierpointError
from tierpoint_client.models import Checkpoint, PlanEntry, TierInfo
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
from tierpoint_client.torch._cache import LocalTier

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
    ) -> None:
        """`checkpoint` may list only the files to be read. `keep`: the files of other nodes
        this node may keep on its local tier, as the server recorded them (`allow_keeping`).
        `token` is sent to the data endpoints of peer copies."""
        if checkpoint.shards is None:
            raise TierpointError("the checkpoint was read without its shards")
        self.job, self.step = checkpoint.job, checkpoint.step
        self.options = options or ReadOptions()
        self.stats = ReadStats()
        self._report = report
        self.local = LocalTier(
            self.job,
            self.step,
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
        every = [c.entry for copies in self.copies.values() for c in copies]
        self._sources = Sources({t.name: t for t in tiers}, every, token)

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
