"""The states of a tier copy (a checkpoint's copy on one tier as a whole) and of a replica (one
shard's copy on one tier).

One home for them: the catalog stores them (text columns with CHECK constraints built from these
lists), the retention planner reasons about them, and they cross Temporal in activity results.
Which moves between them there are, and why, is stated once, as data, by the module that makes
them: `tierpoint/catalog/tier_copy/machine.py` and `tierpoint/catalog/replica/machine.py` (shown in
docs/architecture.md, "The state machines").
"""

from __future__ import annotations

from enum import StrEnum


class ReplicaState(StrEnum):
    PENDING = "pending"
    COPYING = "copying"
    VERIFIED = "verified"
    CORRUPT = "corrupt"
    LOST = "lost"
    EXPIRING = "expiring"
    EXPIRED = "expired"


class TierState(StrEnum):
    PENDING = "pending"
    RESTORABLE = "restorable"
    EXPIRING = "expiring"
    EXPIRED = "expired"
    FAILED = "failed"
