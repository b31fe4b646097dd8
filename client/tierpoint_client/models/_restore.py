"""What a restore is answered and what it did: the step chosen and those skipped, where to read each
shard from (the plan, with a coded copy's stripes), the lease on it, the tiers, and the files
restored."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ._checkpoint import Checkpoint, Replica, Shard, wire_time


@dataclass(frozen=True)
class PlanStripe:
    """A stripe of a coded peer copy: verified on `node`, read at `url` (its holder's data
    endpoint); `size` and `crc32c` are the encoder's."""

    index: int
    node: str
    url: str
    size: int
    crc32c: str

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PlanStripe:
        return cls(int(d["index"]), d["node"], d["url"], int(d["size"]), d["crc32c"])


@dataclass(frozen=True)
class PlanEntry:
    """Where to read one shard from for a restore: the fastest verified copy.

    Locations are data, not URLs: a POSIX copy is read at `location` (an absolute path, opened
    as it is), an S3 copy as the object (`bucket`, `key`). For S3, `location` is for messages
    only; a shard path may hold `?`, `#` or `%`, so taking it apart as a URL would name another
    object."""

    path: str
    size: int
    crc32c: str | None
    tier: str
    kind: str  # local | peer | shared | s3
    node: str | None
    location: str  # absolute POSIX path; for S3 a display string, never parsed
    bucket: str | None = None  # S3 copies only
    key: str | None = None
    # Peer copies: the holding node's data endpoint URL of the file (the server encoded it)
    url: str | None = None
    # A coded peer copy: its code ("rs(k,m)") and the stripes to read any k of
    code: str | None = None
    stripes: tuple[PlanStripe, ...] = ()

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PlanEntry:
        return cls(
            path=d["path"],
            size=int(d["size"]),
            crc32c=d.get("crc32c"),
            tier=d["tier"],
            kind=d["kind"],
            node=d.get("node"),
            location=d["location"],
            bucket=d.get("bucket"),
            key=d.get("key"),
            url=d.get("url"),
            code=d.get("code"),
            stripes=tuple(PlanStripe.from_json(x) for x in d.get("stripes") or ()),
        )

    @classmethod
    def of_replica(cls, shard: Shard, replica: Replica, kind: str) -> PlanEntry:
        """A source of `shard`: its copy `replica` on a tier of `kind`."""
        return cls(
            shard.path,
            shard.size,
            shard.crc32c,
            replica.tier,
            kind,
            replica.node,
            replica.location or "",
            replica.bucket,
            replica.key,
            replica.url,
        )


@dataclass(frozen=True)
class Skipped:
    """A newer step that was not chosen, and why."""

    step: int
    reasons: tuple[str, ...]

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Skipped:
        return cls(step=int(d["step"]), reasons=tuple(str(r) for r in d.get("reasons") or ()))


@dataclass(frozen=True)
class Lease:
    """A restore lease: the checkpoint cannot expire on any tier while it is active."""

    id: int
    job: str
    step: int
    owner: str | None  # who took it (the wire's `holder`)
    expires_at: datetime | None
    active: bool

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Lease:
        return cls(
            id=int(d["id"]),
            job=d["job"],
            step=int(d["step"]),
            owner=d.get("holder"),
            expires_at=wire_time(d.get("expires_at")),
            active=bool(d.get("active", True)),
        )


@dataclass(frozen=True)
class LatestCheckpoint:
    job: str
    step: int
    checkpoint: Checkpoint
    plan: tuple[PlanEntry, ...]
    skipped: tuple[Skipped, ...] = ()
    # Only when asked for with lease_ttl.
    lease: Lease | None = None
    # The tier the answer was restricted to (`latest(tier=...)`): its restore reads that tier only.
    tier: str | None = None
    # A forked job with no restorable checkpoint of its own: this is its fork parent, of the
    # parent job (`job` names it), read where it is.
    fork_parent: bool = False

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> LatestCheckpoint:
        lease = d.get("lease")
        return cls(
            job=d["job"],
            step=int(d["step"]),
            checkpoint=Checkpoint.from_json(d["checkpoint"]),
            plan=tuple(PlanEntry.from_json(p) for p in d.get("plan") or ()),
            skipped=tuple(Skipped.from_json(s) for s in d.get("skipped") or ()),
            lease=Lease.from_json(lease) if isinstance(lease, dict) else None,
            fork_parent=bool(d.get("fork_parent", False)),
        )

    @property
    def total_bytes(self) -> int:
        return sum(p.size for p in self.plan)


@dataclass(frozen=True)
class TierInfo:
    name: str
    kind: str
    root: str | None
    bucket: str | None
    prefix: str
    endpoint_url: str | None
    region: str | None
    # S3 tiers: whose keys read it, as the server's tier names them (None: the standard chain).
    credentials_profile: str | None = None
    credentials_env: str | None = None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TierInfo:
        return cls(
            name=d["name"],
            kind=d["kind"],
            root=d.get("root"),
            bucket=d.get("bucket"),
            prefix=d.get("prefix") or "",
            endpoint_url=d.get("endpoint_url"),
            region=d.get("region"),
            credentials_profile=d.get("credentials_profile"),
            credentials_env=d.get("credentials_env"),
        )


@dataclass(frozen=True)
class RestoreStart:
    """The one answer a restore starts from (`Client.start_restore`): the step, the lease held
    on it, the checkpoint with every copy of every file, and the tiers those copies are on.
    `job` is the checkpoint's own: a fork's first restore answers its parent's (`fork_parent`)."""

    job: str
    step: int
    lease: Lease
    checkpoint: Checkpoint
    tiers: tuple[TierInfo, ...]
    skipped: tuple[Skipped, ...] = ()
    fork_parent: bool = False

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RestoreStart:
        return cls(
            job=d["job"],
            step=int(d["step"]),
            lease=Lease.from_json(d["lease"]),
            checkpoint=_with_coded(Checkpoint.from_json(d["checkpoint"]), d.get("coded") or ()),
            tiers=tuple(TierInfo.from_json(t) for t in d["tiers"]),
            skipped=tuple(Skipped.from_json(s) for s in d.get("skipped") or ()),
            fork_parent=bool(d.get("fork_parent", False)),
        )


def _with_coded(cp: Checkpoint, coded: Sequence[dict[str, Any]]) -> Checkpoint:
    """`cp` with each shard's coded copies (the restore's `coded`: per tier, per file, the
    stripes): a file's sources are then all on its shard."""
    if not coded or cp.shards is None:
        return cp
    by_path: dict[str, list[PlanEntry]] = {}
    for copy in coded:
        for f in copy["files"]:
            by_path.setdefault(f["path"], []).append(
                PlanEntry(
                    f["path"],
                    0,
                    None,
                    copy["tier"],
                    "peer",
                    None,
                    f"{copy['code']} stripes on {len(f['stripes'])} holders",
                    code=copy["code"],
                    stripes=tuple(PlanStripe.from_json(x) for x in f["stripes"]),
                )
            )
    shards = tuple(
        dataclasses.replace(
            s,
            coded=tuple(
                dataclasses.replace(e, size=s.size, crc32c=s.crc32c)
                for e in by_path.get(s.path, ())
            ),
        )
        for s in cp.shards
    )
    return dataclasses.replace(cp, shards=shards)


@dataclass(frozen=True)
class RestoredFile:
    path: str
    size: int
    crc32c: str
    tier: str
    source: str


@dataclass(frozen=True)
class RestoreResult:
    job: str
    step: int
    dest_dir: str
    files: tuple[RestoredFile, ...]
    bytes_total: int
    seconds: float
    checkpoint: Checkpoint
    skipped: tuple[Skipped, ...] = field(default=())
    # Entries of the destination outside the checkpoint: removed (existing="clean"), or left
    # beside it (existing="overwrite"), relative to the destination.
    removed: tuple[str, ...] = field(default=())
    kept: tuple[str, ...] = field(default=())

    @property
    def tiers_used(self) -> dict[str, int]:
        """How many shards came from each tier."""
        used: dict[str, int] = {}
        for f in self.files:
            used[f.tier] = used.get(f.tier, 0) + 1
        return used
