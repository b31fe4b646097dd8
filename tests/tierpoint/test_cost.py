"""Default prices: every tier kind has one (S3 by its storage class), so usage, the dry run and
the cost views answer for any configuration."""

from __future__ import annotations

from tierpoint.cost import price_per_gb_month
from tierpoint.tier_config import StorageClass, TierConfig, TierKind


def test_every_kind_and_storage_class_has_a_default_price() -> None:
    for kind in TierKind:
        if kind is TierKind.S3:
            for cls in StorageClass:
                tier = TierConfig(name="s3", kind=kind, bucket="b", storage_class=cls)
                assert price_per_gb_month(tier) > 0
            continue
        tier = TierConfig(name=str(kind), kind=kind, root="/x")
        assert price_per_gb_month(tier) > 0, kind
