"""The ordered tiers, from the fastest, most local one to the most durable one, and the node
this process speaks for."""

from __future__ import annotations

from pydantic import BaseModel, Field, field_validator

from tierpoint.errors import UnknownTier
from tierpoint.tier_config import TierConfig, TierKind, expand_copies


class TiersSettings(BaseModel):
    tiers: list[TierConfig] = Field(
        default_factory=list,
        description="The tiers, ordered from the fastest, most local one to the most durable "
        "one (see Tier below). As an environment variable: a JSON list. A peer tier with "
        "`copies = K` is read as K peer tiers (its `copies`), which every process and "
        "`GET /v1/tiers` list.",
    )
    node: str | None = Field(
        default=None,
        description="This node's id, one variable for both sides of a node: `tierpoint worker "
        "--no-shared` serves it when no `--node` is given, and the training client (the PyTorch "
        "writer and reader) registers and finds shards under it. On Kubernetes: `spec.nodeName`.",
    )

    @field_validator("tiers")
    @classmethod
    def _tiers(cls, tiers: list[TierConfig]) -> list[TierConfig]:
        # A peer tier with `copies = K` is K peer tiers from here on, for every process alike.
        tiers = expand_copies(tiers)
        names = [t.name for t in tiers]
        if len(set(names)) != len(names):
            raise ValueError("tier names must be unique")
        # Nothing can copy from (or restore from) a tier whose objects must be restored first.
        for t in tiers[:-1]:
            if t.needs_restore_request:
                raise ValueError(
                    f"tier {t.name!r} has storage class {t.storage_class}, whose objects need a "
                    "restore request before they can be read: it can only be the last tier"
                )
        # A peer tier holds copies of the local tier's files: something local must come first.
        for i, t in enumerate(tiers):
            if t.kind is TierKind.PEER and not any(u.kind is TierKind.LOCAL for u in tiers[:i]):
                raise ValueError(f"peer tier {t.name!r} needs a local tier before it")
        return tiers

    def tier(self, name: str, location: str = "query") -> TierConfig:
        """The tier named `name`; the one answer to "is it configured" (raises UnknownTier)."""
        for t in self.tiers:
            if t.name == name:
                return t
        raise UnknownTier.named(name, self.tier_names(), location)

    def tier_names(self) -> list[str]:
        return [t.name for t in self.tiers]

    def local_tier_names(self) -> list[str]:
        """The tiers local to one node (a node declared lost takes its copies there along)."""
        return [t.name for t in self.tiers if t.kind is TierKind.LOCAL]

    def local_tier(self) -> TierConfig | None:
        return next((t for t in self.tiers if t.kind is TierKind.LOCAL), None)

    def peer_tiers(self) -> list[TierConfig]:
        """The peer tiers in order: the i-th (from 1) holds node N's copy on the i-th holder of N's
        placement (activities/placement.py), so K peer tiers keep K copies on K distinct nodes.
        A peer tier with `copies = K` is K of them (tier_config.expand_copies)."""
        return [t for t in self.tiers if t.kind is TierKind.PEER]
