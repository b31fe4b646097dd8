"""What a job's checkpoints cost to keep, from the catalog's bytes and the configured prices.

Prices are configuration (`price_per_gb_month` per tier), never fetched: the defaults below are
the public us-east-1 list prices of late 2026 for the S3 storage classes, and stand-ins for the
capacity cost of the POSIX kinds (node-local NVMe priced like gp3 block storage, the shared file
system like FSx for Lustre persistent SSD). Operators with real numbers override them per tier.
Like the clouds, a GB here is 2^30 bytes and a month is a billing month, not 30 days of seconds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tierpoint.tier_config import StorageClass, TierConfig, TierKind

GB = 1 << 30

DEFAULT_PRICE_PER_GB_MONTH: dict[TierKind | StorageClass, float] = {
    TierKind.LOCAL: 0.08,
    # A peer copy lives on its holder's node-local NVMe, as a local one does.
    TierKind.PEER: 0.08,
    TierKind.SHARED: 0.145,
    StorageClass.STANDARD: 0.023,
    # The frequent-access tier's price: objects read within 30 days (restores) stay there.
    StorageClass.INTELLIGENT_TIERING: 0.023,
    StorageClass.STANDARD_IA: 0.0125,
    StorageClass.ONEZONE_IA: 0.01,
    StorageClass.GLACIER_IR: 0.004,
    StorageClass.GLACIER: 0.0036,
    StorageClass.DEEP_ARCHIVE: 0.00099,
}


def price_per_gb_month(tier: TierConfig) -> float:
    if tier.price_per_gb_month is not None:
        return tier.price_per_gb_month
    if tier.kind is TierKind.S3:
        return DEFAULT_PRICE_PER_GB_MONTH[tier.storage_class]
    return DEFAULT_PRICE_PER_GB_MONTH[tier.kind]


def held_per_byte(tier: TierConfig) -> float:
    """Bytes the tier holds per byte of the files it keeps: a coded peer tier (k+m)/k, in its
    stripes (k data and m parity stripes of 1/k of a file each; a stripe's few header bytes per
    4 MiB segment left out), every other tier 1."""
    code = tier.stripe_code
    return 1.0 if code is None else code.width / code.k


def held_bytes(tier: TierConfig, nbytes: int) -> int:
    """The bytes `tier` holds to keep `nbytes` of checkpoint files."""
    return math.ceil(nbytes * held_per_byte(tier))


def monthly_cost(tier: TierConfig, nbytes: int) -> float:
    """US dollars per month for keeping `nbytes` of checkpoint files on `tier` (the bytes it
    holds for them: `held_bytes`), to a millionth of a dollar."""
    # guard: coded-tier-costs-its-stripes
    return round(held_bytes(tier, nbytes) / GB * price_per_gb_month(tier), 6)


@dataclass(frozen=True)
class TierCost:
    tier: str
    price_per_gb_month: float
    monthly_cost_now: float
    monthly_cost_after: float


@dataclass(frozen=True)
class CostSummary:
    tiers: tuple[TierCost, ...]
    monthly_cost_now: float
    monthly_cost_after: float


def summarise(tiers: Sequence[TierConfig], usage: Iterable[tuple[str, int, int]]) -> CostSummary:
    """Costs of (tier, bytes now, bytes after the planned expiries) rows, per tier and summed."""
    by_name = {t.name: t for t in tiers}
    rows = tuple(
        TierCost(
            tier=name,
            price_per_gb_month=price_per_gb_month(by_name[name]),
            monthly_cost_now=monthly_cost(by_name[name], now),
            monthly_cost_after=monthly_cost(by_name[name], after),
        )
        for name, now, after in usage
    )
    return CostSummary(
        tiers=rows,
        monthly_cost_now=round(sum(r.monthly_cost_now for r in rows), 6),
        monthly_cost_after=round(sum(r.monthly_cost_after for r in rows), 6),
    )
