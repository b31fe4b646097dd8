"""The catalog: where every shard of every checkpoint lives, and in what state.

States are stored as text with CHECK constraints rather than native Postgres enums, so adding a
state is a one-line migration.

The tables are declared in this package's private modules, one per concept; this module is the
one import path of every table (`from tierpoint.catalog.models import Checkpoint`), and importing
it registers them all on `Base.metadata`, which the migrations are checked against.
"""

from tierpoint.catalog.models._base import RESTORABLE, VERIFIED, Base
from tierpoint.catalog.models._checkpoint import Checkpoint, Event, RestoreLease, Shard
from tierpoint.catalog.models._copies import CachedCopy, Replica, Stripe, TierCopy
from tierpoint.catalog.models._fleet import Branch, Job, Node, RetentionPolicy
from tierpoint.catalog.models._tokens import AccessToken
from tierpoint.catalog.models._totals import ByteTotal, JobTierUsage, ScrubStats, TierReadStats

__all__ = [
    "RESTORABLE",
    "VERIFIED",
    "AccessToken",
    "Base",
    "Branch",
    "ByteTotal",
    "CachedCopy",
    "Checkpoint",
    "Event",
    "Job",
    "JobTierUsage",
    "Node",
    "Replica",
    "RestoreLease",
    "RetentionPolicy",
    "ScrubStats",
    "Shard",
    "Stripe",
    "TierCopy",
    "TierReadStats",
]
