"""Dataclasses mirroring the REST API's JSON shapes.

Parsing is tolerant of fields the client does not know yet (newer servers), strict about the ones
it relies on (a missing one raises KeyError at parse time, not later during a restore).

The shapes are declared in this package's private modules, one per concept: a checkpoint as the
catalog describes it (`_checkpoint`) and what a restore is answered and did (`_restore`); this
module is their one import path.
"""

from ._checkpoint import Checkpoint, Progress, Replica, Shard, ShardSpec, TierCopy
from ._restore import (
    LatestCheckpoint,
    Lease,
    PlanEntry,
    PlanStripe,
    RestoredFile,
    RestoreResult,
    RestoreStart,
    Skipped,
    TierInfo,
)

__all__ = [
    "Checkpoint",
    "LatestCheckpoint",
    "Lease",
    "PlanEntry",
    "PlanStripe",
    "Progress",
    "Replica",
    "RestoreResult",
    "RestoreStart",
    "RestoredFile",
    "Shard",
    "ShardSpec",
    "Skipped",
    "TierCopy",
    "TierInfo",
]
