"""The stateful test's own model of one example's job, kept from what the test did and never
read back from tierpoint: what was registered with which bytes, which files exist that were never
registered, pins, leases, quarantines, the damage the test did behind the store's back, and the
policies in force. The checks compare the real stack with it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import crc32c

TIERS = ("ssd", "lustre", "s3")
LOCAL, SHARED, S3 = TIERS

# Shard names a POSIX file system holds that URLs, S3 or shells treat specially: each must work
# end to end or be refused at registration.
NAMES = (
    "a.bin",
    "model/rank0.safetensors",
    "model.safetensors?rank=0",
    "w.bin",
    "w.bin#x",
    "pct%41.bin",
    "plus+1.bin",
    "sp ace.bin",
    "semi;colon.bin",
    "caf\u00e9.bin",  # NFC
    "cafe\u0301.bin",  # the same name in NFD: a different file on Linux
    "trailing.",
    "deep/er/nest.bin",
    "amp&k=v.bin",
)

POLICIES: dict[str, dict[str, Any]] = {
    # Every copy stays.
    "keep-all": {"format": 1, "kinds": {"local": {}, "shared": {}}},
    # Local and shared copies go quickly; S3 (the most durable tier, no rules) keeps everything.
    "tight": {"format": 1, "kinds": {"local": {"keep_last": 1}, "shared": {"keep_last": 1}}},
    # S3 keeps only the newest: older checkpoints may go altogether unless protected.
    "durable-1": {
        "format": 1,
        "kinds": {"local": {"keep_last": 1}, "shared": {"keep_last": 1}},
        "durable": {"keep_last": 1},
    },
}
LOSSY_POLICIES = frozenset({"durable-1"})


def crc_hex(data: bytes) -> str:
    return f"{crc32c.crc32c(data):08x}"


@dataclass
class ShardModel:
    node: str
    data: bytes

    @property
    def crc(self) -> str:
        return crc_hex(self.data)


@dataclass
class StepModel:
    step: int
    shards: dict[str, ShardModel]
    # The store may lose it without a bug: the test destroyed its only copy or its node was lost
    # before it left it (destroyed), or a policy that expires durable copies applied to it (lossy).
    destroyed: bool = False
    lossy: bool = False
    pinned: bool = False
    # Tiers restorable when a pin, a lease or an operator's quarantine began: never expired
    # while that protection lasts.
    protected_tiers: set[str] = field(default_factory=set)
    leases: set[int] = field(default_factory=set)
    quarantined: bool = False  # by an operator, the whole checkpoint
    train_quarantined: bool = False
    tier_quarantined: set[str] = field(default_factory=set)
    # A shard that is a symlink out of its step directory was accepted at registration (sealing
    # must refuse it: it never reaches another tier, latest never offers it).
    escaped: bool = False
    # Registered with checksums (else the seal computes them: a step whose bytes went before its
    # seal never has them).
    crc_registered: bool = True
    # Tiers whose copy the test ever damaged (kept after repair forgot the damage).
    damaged_tiers: set[str] = field(default_factory=set)
    # (tier, path) whose bytes the test changed or removed and the store has not been told of.
    damage: set[tuple[str, str]] = field(default_factory=set)
    # Its health verdict (docs/timeline.md): a bad one quarantines it as evidence.
    verdict: str | None = None

    @property
    def protected(self) -> bool:
        return self.pinned or bool(self.leases) or self.quarantined


@dataclass
class Model:
    job: str
    nodes: tuple[str, str]
    policy: str = "keep-all"
    steps: dict[int, StepModel] = field(default_factory=dict)
    next_step: int = 1
    # Files the test put on a tier that were never registered:
    # (tier, node, job, step, path) -> bytes.
    unregistered: dict[tuple[str, str | None, str, int, str], bytes] = field(default_factory=dict)
    lost_nodes: set[str] = field(default_factory=set)
    # How often each kind of action ran, and each check was made (reported at the end).
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def victim_job(self) -> str:
        """Another job on the same tiers, which this job's training token does not cover."""
        return "victim-" + self.job

    def policy_is_lossy(self) -> bool:
        return self.policy in LOSSY_POLICIES

    def live_nodes(self) -> list[str]:
        return [n for n in self.nodes if n not in self.lost_nodes]

    def take_step(self) -> int:
        step = self.next_step
        self.next_step += 1
        return step

    def count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    def registered(self) -> list[StepModel]:
        return [self.steps[s] for s in sorted(self.steps)]

    def must_keep(self, sm: StepModel) -> bool:
        """A checkpoint the store must never lose (a rule keeps it, nothing excuses its loss)."""
        if sm.destroyed or sm.escaped:
            return False
        return not sm.lossy or (sm.protected and bool(sm.protected_tiers))

    def expected(self, step: int, path: str) -> bytes | None:
        sm = self.steps.get(step)
        shard = sm.shards.get(path) if sm else None
        return shard.data if shard else None
