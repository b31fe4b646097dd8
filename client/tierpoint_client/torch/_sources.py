"""Reading a checkpoint's files for DCP: every verified copy of a file, fastest first, read so that
every byte handed to DCP is verified (see _reads), with this node's local tier re-populated from
what a load read elsewhere: the node's own files put back in place, and other nodes' files kept
as a cache once the server has recorded them (so that the copy's expiry deletes them)."""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tierpoint_client.errors import NoVerifiedCopyError, SourceError, TierpointError
from tierpoint_client.models import Checkpoint, PlanEntry, TierInfo
from tierpoint_client.sources import Sources
from tierpoint_client.torch._files import AtomicFile, local_tier
from tierpoint_client.torch._reads import (
    Mismatch,
    Placement,
    Range,
    coalesce,
    read_placed,
    read_ranges,
    read_streamed,
    read_whole,
)
from tierpoint_client.torch._striped import read_striped, striped

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
class _Source:
    entry: PlanEntry
    # A file in this node's local-tier directory of the checkpoint that the catalog does not list
    # as this node's copy: a cache the reader wrote, trusted only once it verifies.
    cached: bool = False


class CheckpointFiles:
    """The sources of one checkpoint's files: first this node's local copy (the catalog's, or a
    cached one), then every verified replica on a tier whose tier copy is restorable, in the tiers'
    configured order (fastest first). A node-local replica is used only on its own node; `tier`
    restricts the sources to that tier."""

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
        local = local_tier(tiers)
        self.local_dir: Path | None = None
        if node is not None and local is not None and local.root is not None:
            root = Path(local.root.replace("{node}", node))
            self.local_dir = root / self.job / str(self.step)
        restorable = set(checkpoint.restorable_tiers())
        self.local_tier = local.name if local is not None else None
        self._keep = set(keep)
        # This node's own files, whose catalog copy here is usable: put back in place if missing.
        self._own: set[str] = set()
        self._not_ours: set[str] = set()
        order = {t.name: i for i, t in enumerate(tiers)}
        kinds = {t.name: t.kind for t in tiers}
        self.sources: dict[str, list[_Source]] = {}
        self.sizes: dict[str, tuple[int, str | None]] = {}
        for shard in checkpoint.shards:
            found: list[_Source] = []
            for r in sorted(shard.replicas, key=lambda r: order.get(r.tier, len(order))):
                kind = kinds.get(r.tier)
                if r.state != "verified" or not r.location or r.tier not in restorable:
                    continue
                if kind is None or (tier is not None and r.tier != tier):
                    continue
                if kind == "local" and (node is None or r.node != node):
                    continue
                found.append(_Source(PlanEntry.of_replica(shard, r, kind)))
            mine = self._local_path(shard.path)
            known = any(_same_file(r.location or "", mine) for r in shard.replicas)
            if known and any(_same_file(s.entry.location, mine) for s in found):
                self._own.add(shard.path)
            elif known:
                # The catalog's own copy, not verified or on a tier not restorable (being sealed,
                # failed, expiring): the server's to handle, neither a cache nor to overwrite.
                self._not_ours.add(shard.path)
            usable = local is not None and (tier is None or tier == local.name)
            if mine is not None and local is not None and usable and not known:
                cache = PlanEntry(
                    shard.path, shard.size, shard.crc32c, local.name, "local", node, str(mine)
                )
                found.insert(0, _Source(cache, cached=True))
            self.sources[shard.path] = found
            self.sizes[shard.path] = (shard.size, shard.crc32c)
        tier_map = {t.name: t for t in tiers}
        every = [s.entry for sources in self.sources.values() for s in sources]
        self._sources = Sources(tier_map, every, token)
        self._token = token

    def read(
        self,
        path: str,
        ranges: Sequence[Range] | None = None,
        crcs: Mapping[Range, str | None] | None = None,
        into: Placement | None = None,
    ) -> dict[Range, bytearray]:
        """The bytes of `ranges` of the file (the whole file when None), from the first source
        that verifies. `crcs` are the ranges' own crc32c (from `.metadata`): with all of them
        known, a large S3 file of which little is needed is read in ranges. A source that does
        not verify, or cannot be read, is reported with a warning and the next one is tried.
        With `into`, a POSIX copy is read into the memory it gives (and {} returned)."""
        if path not in self.sources:
            raise TierpointError(f"{self.job}/{self.step} has no file {path!r}")
        size, _ = self.sizes[path]
        wanted = sorted(set(ranges)) if ranges is not None else [(0, size)]
        known = {r: c for r, c in (crcs or {}).items() if c is not None}
        tried: list[str] = []
        for source in self.sources[path]:
            entry = source.entry
            if source.cached and not os.path.exists(entry.location):
                continue  # no cached copy: nothing to warn about
            try:
                if self._ranged(entry, wanted, known):
                    got, fetched = read_ranges(self._sources, entry, wanted, known)
                    how = f"{entry.tier} (ranged)"
                else:
                    copy = self._new_copy(source)
                    if into is not None and entry.kind in ("local", "shared"):
                        got, copied = {}, read_placed(entry, into, copy)
                    elif into is not None and striped(entry, copy):
                        read_striped(entry, into, self._token)
                        got, copied = {}, False
                    elif into is not None and entry.kind in ("s3", "peer"):
                        got, copied = {}, read_streamed(self._sources, entry, into, copy)
                    else:
                        got, copied = read_whole(self._sources, entry, wanted, copy)
                    fetched = entry.size
                    how = f"{entry.tier} (cache)" if source.cached else entry.tier
                    if copied:
                        self.stats.repopulated.append(path)
            except (SourceError, OSError, Mismatch) as e:
                tried.append(f"{entry.tier}: {e}")
                self._failed(source, e)
                continue
            self.stats.files[path] = how
            self.stats.bytes_fetched += fetched
            return got
        raise NoVerifiedCopyError(self.job, self.step, path, tried)

    def allow_keeping(self, paths: frozenset[str]) -> None:
        """Other nodes' files this node may keep on its local tier: those the server recorded
        (`Client.record_cached_copies`), so that the copy's expiry deletes them."""
        self._keep |= paths

    def keep(self, path: str, data: bytes) -> None:
        """Write a file already read whole and verified (its bytes `data`) to this node's local
        tier, if it may keep it and it was read from elsewhere."""
        if self.stats.files.get(path) in (self.local_tier, f"{self.local_tier} (cache)"):
            return  # read here
        entry = next((s.entry for s in self.sources.get(path, ()) if not s.cached), None)
        copy = self._new_copy(_Source(entry)) if entry is not None else None
        if copy is None:
            return
        try:
            copy.write(data)
            copy.commit()
        except OSError as e:
            copy.abort()
            warnings.warn(f"tierpoint: cannot keep {path} on this node ({e})", stacklevel=2)
            return
        self.stats.repopulated.append(path)

    # -- helpers ------------------------------------------------------------------------------

    def _local_path(self, path: str) -> Path | None:
        return None if self.local_dir is None else self.local_dir / path

    def _is_here(self, entry: PlanEntry) -> bool:
        return _same_file(entry.location, self._local_path(entry.path))

    def _ranged(self, entry: PlanEntry, wanted: list[Range], crcs: Mapping[Range, str]) -> bool:
        if entry.kind != "s3" or entry.size < self.options.min_ranged_size:
            return False
        if any(r not in crcs for r in wanted):
            return False
        needed = sum(end - start for start, end in coalesce(wanted))
        return needed * 2 <= entry.size

    def _new_copy(self, source: _Source) -> AtomicFile | None:
        """A new local copy of the file being read, when re-population is on and this read is
        not of the local copy itself: this node's own file put back in place, or another node's
        that the server recorded as kept here; only inside an existing local-tier root."""
        target = self._local_path(source.entry.path)
        allowed = source.entry.path in self._own or source.entry.path in self._keep
        if not (self.options.repopulate and allowed) or target is None:
            return None
        if self._is_here(source.entry) or source.entry.path in self._not_ours:
            return None
        assert self.local_dir is not None
        root = self.local_dir.parent.parent
        if not root.is_dir():
            return None  # this machine has no local tier mounted: nothing to populate
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            copy = AtomicFile(target)
        except OSError as e:
            warnings.warn(
                f"tierpoint: cannot write a local copy to {target} ({e}); the load goes on",
                stacklevel=4,
            )
            return None
        return copy

    def _failed(self, source: _Source, e: Exception) -> None:
        entry = source.entry
        corrupt = isinstance(e, Mismatch)
        what = "failed verification" if corrupt else "could not be read"
        kind = " (cached copy)" if source.cached else ""
        warnings.warn(
            f"tierpoint: {self.job}/{self.step} {entry.path} on tier {entry.tier}{kind} {what} "
            f"({e}); trying the next copy",
            stacklevel=4,
        )
        if not corrupt:
            return
        if source.cached:
            # Ours, unknown to the catalog: drop it so that the next copy read replaces it.
            with contextlib.suppress(OSError):
                os.unlink(entry.location)
        elif self._report is not None:
            self._report(entry, f"{what} on read: {e}")


def _same_file(location: str, path: Path | None) -> bool:
    return path is not None and os.path.normpath(location) == os.path.normpath(path)
