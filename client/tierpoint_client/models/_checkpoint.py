"""A checkpoint as the catalog describes it: its shards, every copy of each on every tier, and
how far each tier's copy has come."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from tierpoint_client.timeline import CheckpointRef, Health

if TYPE_CHECKING:
    from ._restore import PlanEntry


def wire_time(value: Any) -> datetime | None:
    if value is None:
        return None
    text = str(value)
    # Python 3.10's fromisoformat does not take the "Z" suffix.
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    return datetime.fromisoformat(text)


@dataclass(frozen=True)
class ShardSpec:
    """One manifest entry as registered."""

    path: str
    size: int
    crc32c: str | None
    node: str

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "crc32c": self.crc32c, "node": self.node}


@dataclass(frozen=True)
class Progress:
    shards_total: int
    shards_verified: int
    bytes_total: int
    bytes_done: int

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Progress:
        return cls(
            shards_total=int(d.get("shards_total", 0)),
            shards_verified=int(d.get("shards_verified", 0)),
            bytes_total=int(d.get("bytes_total", 0)),
            bytes_done=int(d.get("bytes_done", 0)),
        )


@dataclass(frozen=True)
class TierCopy:
    """The checkpoint's copy on one tier: its state and, while it copies, its progress."""

    tier: str
    kind: str
    state: str  # pending | restorable | expiring | expired | failed
    reason: str | None
    restorable_at: datetime | None
    progress: Progress | None
    quarantine_reason: str | None = None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TierCopy:
        progress = d.get("progress")
        return cls(
            tier=d["tier"],
            kind=d.get("kind", ""),
            state=d["state"],
            reason=d.get("reason"),
            restorable_at=wire_time(d.get("restorable_at")),
            progress=Progress.from_json(progress) if isinstance(progress, dict) else None,
            quarantine_reason=d.get("quarantine_reason"),
        )


@dataclass(frozen=True)
class Replica:
    tier: str
    node: str | None
    state: str
    location: str | None  # for display only: never parsed (see PlanEntry)
    bytes_done: int | None
    verified_at: datetime | None
    error: str | None
    bucket: str | None = None  # S3 copies: the object
    key: str | None = None
    url: str | None = None  # peer copies: the holder's data endpoint URL of the file

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Replica:
        return cls(
            tier=d["tier"],
            node=d.get("node"),
            state=d["state"],
            location=d.get("location"),
            bytes_done=d.get("bytes_done"),
            verified_at=wire_time(d.get("verified_at")),
            error=d.get("error"),
            bucket=d.get("bucket"),
            key=d.get("key"),
            url=d.get("url"),
        )


@dataclass(frozen=True)
class Shard:
    path: str
    size: int
    crc32c: str | None
    node: str
    replicas: tuple[Replica, ...]
    # Its coded copies (a coded peer tier keeps stripes, not replicas), as a restore's start
    # lists them (`RestoreStart`): each a plan entry with its code and stripes.
    coded: tuple[PlanEntry, ...] = ()

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Shard:
        return cls(
            path=d["path"],
            size=int(d["size"]),
            crc32c=d.get("crc32c"),
            node=d["node"],
            replicas=tuple(Replica.from_json(r) for r in d.get("replicas") or ()),
        )


@dataclass(frozen=True)
class Checkpoint:
    job: str
    step: int
    created_at: datetime | None
    metadata: dict[str, Any]
    pinned: bool
    quarantine_reason: str | None
    total_bytes: int
    shard_count: int
    tiers: tuple[TierCopy, ...]
    # Only GET /v1/jobs/{job}/checkpoints/{step} lists the shards.
    shards: tuple[Shard, ...] | None = None
    # Its place in the run's timeline (timeline.py): the branch it was saved on, the branch
    # whose rollback superseded it (None: on the job's timeline), its health verdict, the
    # checkpoint the run had loaded before writing it, and where it came from.
    id: int | None = None
    branch: int = 1
    superseded_by: int | None = None
    health: Health | None = None
    parent: CheckpointRef | None = None
    provenance: dict[str, Any] | None = None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Checkpoint:
        shards = d.get("shards")
        return cls(
            job=d["job"],
            step=int(d["step"]),
            created_at=wire_time(d.get("created_at")),
            metadata=dict(d.get("metadata") or {}),
            pinned=bool(d.get("pinned", False)),
            quarantine_reason=d.get("quarantine_reason"),
            total_bytes=int(d.get("total_bytes", 0)),
            shard_count=int(d.get("shard_count", 0)),
            tiers=tuple(TierCopy.from_json(t) for t in d.get("tiers") or ()),
            shards=tuple(Shard.from_json(s) for s in shards) if shards is not None else None,
            id=int(d["id"]) if d.get("id") is not None else None,
            branch=int(d.get("branch") or 1),
            superseded_by=int(d["superseded_by"]) if d.get("superseded_by") is not None else None,
            health=Health.from_json(d["health"]) if d.get("health") else None,
            parent=CheckpointRef.from_json(d["parent"]) if d.get("parent") else None,
            provenance=d.get("provenance"),
        )

    @property
    def ref(self) -> CheckpointRef:
        return CheckpointRef(self.job, self.step, self.branch, self.id)

    def tier(self, name: str) -> TierCopy | None:
        return next((t for t in self.tiers if t.tier == name), None)

    def restorable_tiers(self) -> list[str]:
        """The tiers a restore may read this checkpoint from: restorable, and neither the
        checkpoint nor that tier's copy quarantined (a verdict that it must not be restored
        from, whatever its bytes)."""
        if self.quarantine_reason is not None:
            return []
        return [
            t.tier for t in self.tiers if t.state == "restorable" and t.quarantine_reason is None
        ]
