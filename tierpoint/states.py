"""The states a shard's copy (replica) and a checkpoint's copy on one tier (its marker) go through.

One home for them: the catalog stores them (text columns with CHECK constraints built from these
lists), the retention planner reasons about them, and they cross Temporal in activity results.

Replica: `pending -> copying -> verified`, or `corrupt` (a read proved it bad), `lost` (its node was
declared lost), `expiring -> expired` (retention). Marker: `pending -> restorable`, or `failed`,
`restorable -> expiring -> expired` (retention).
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
