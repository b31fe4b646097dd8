"""Reading a checkpoint's files for DCP: every verified copy of a file, fastest first, and a read
that verifies the whole file while it keeps only the byte ranges the caller needs."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

from tierpoint_client.errors import TierpointError
from tierpoint_client.hashing import CHUNK_SIZE, crc32c_hex, update
from tierpoint_client.models import Checkpoint, PlanEntry, TierInfo
from tierpoint_client.restore import SourceError, Sources

Range = tuple[int, int]  # (offset, length) inside a file


class NoVerifiedCopyError(TierpointError):
    """No source of a file gave bytes matching its registered size and crc32c."""

    def __init__(self, job: str, step: int, path: str, tried: Sequence[str]) -> None:
        self.job, self.step, self.path, self.tried = job, step, path, tuple(tried)
        detail = "; ".join(tried) if tried else "no verified copy is listed on any usable tier"
        super().__init__(f"{job}/{step}: no verified copy of {path!r} ({detail})")


class CheckpointFiles:
    """The sources of one checkpoint's files: per file, every verified replica on a tier whose
    marker is restorable, in the tiers' configured order (fastest first). A node-local copy is
    used only on its own node; `tier` restricts the sources to that tier."""

    def __init__(
        self,
        checkpoint: Checkpoint,
        tiers: Sequence[TierInfo],
        *,
        node: str | None,
        tier: str | None,
    ) -> None:
        if checkpoint.shards is None:
            raise TierpointError("the checkpoint was read without its shards")
        self.job, self.step = checkpoint.job, checkpoint.step
        restorable = set(checkpoint.restorable_tiers())
        order = {t.name: i for i, t in enumerate(tiers)}
        kinds = {t.name: t.kind for t in tiers}
        self.entries: dict[str, list[PlanEntry]] = {}
        self.sizes: dict[str, tuple[int, str | None]] = {}
        for shard in checkpoint.shards:
            found: list[PlanEntry] = []
            for r in sorted(shard.replicas, key=lambda r: order.get(r.tier, len(order))):
                kind = kinds.get(r.tier)
                if r.state != "verified" or not r.location or r.tier not in restorable:
                    continue
                if kind is None or (tier is not None and r.tier != tier):
                    continue
                if kind == "local" and (node is None or r.node != node):
                    continue
                entry = PlanEntry(
                    shard.path, shard.size, shard.crc32c, r.tier, kind, r.node, r.location
                )
                found.append(entry)
            self.entries[shard.path] = found
            self.sizes[shard.path] = (shard.size, shard.crc32c)
        tier_map = {t.name: t for t in tiers}
        every = [e for entries in self.entries.values() for e in entries]
        self._sources = Sources(tier_map, every)

    def read(self, path: str, ranges: Sequence[Range] | None = None) -> dict[Range, bytearray]:
        """The bytes of `ranges` of the file (the whole file when None), from the first source
        whose whole file matches the registered size and crc32c. A source that does not match,
        or cannot be read, is reported with a warning and the next one is tried."""
        if path not in self.entries:
            raise TierpointError(f"{self.job}/{self.step} has no file {path!r}")
        size, _ = self.sizes[path]
        wanted = sorted(set(ranges)) if ranges is not None else [(0, size)]
        tried: list[str] = []
        for entry in self.entries[path]:
            try:
                got = self._read_verified(entry, wanted)
            except (SourceError, OSError, _Mismatch) as e:
                tried.append(f"{entry.tier}: {e}")
                what = "failed verification" if isinstance(e, _Mismatch) else "could not be read"
                warnings.warn(
                    f"tierpoint: {self.job}/{self.step} {path} on tier {entry.tier} {what} "
                    f"({e}); trying the next copy",
                    stacklevel=3,
                )
                continue
            return got
        raise NoVerifiedCopyError(self.job, self.step, path, tried)

    def _read_verified(self, entry: PlanEntry, wanted: list[Range]) -> dict[Range, bytearray]:
        bufs = [bytearray(length) for _, length in wanted]
        first = 0  # ranges before this one are complete
        pos = 0
        crc = 0
        for chunk in self._sources.chunks(entry, CHUNK_SIZE):
            n = len(chunk)
            crc = update(crc, chunk)
            end = pos + n
            if end > entry.size:
                raise _Mismatch(f"larger than the registered {entry.size} bytes")
            i = first
            while i < len(wanted) and wanted[i][0] < end:
                off, length = wanted[i]
                lo, hi = max(off, pos), min(off + length, end)
                if lo < hi:
                    bufs[i][lo - off : hi - off] = chunk[lo - pos : hi - pos]
                if off + length <= end and i == first:
                    first += 1
                i += 1
            pos = end
        actual = crc32c_hex(crc)
        if pos != entry.size:
            raise _Mismatch(f"{pos} bytes, registered {entry.size}")
        if entry.crc32c is not None and actual != entry.crc32c.lower():
            raise _Mismatch(f"crc32c {actual}, registered {entry.crc32c}")
        return dict(zip(wanted, bufs, strict=True))


class _Mismatch(Exception):
    pass
