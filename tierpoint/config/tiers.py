"""The ordered tiers, from the fastest, most local one to the most durable one, and the node
this process speaks for; the rules of the list as a whole (each tier's own options:
tierpoint.tier_config), a peer tier of `copies = K` read as K tiers among them."""

from __future__ import annotations

from pydantic import BaseModel, Field, field_validator

from tierpoint.errors import UnknownTier
from tierpoint.tier_config import NAME_RE, TierConfig, TierKind


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
        A peer tier with `copies = K` is K of them (expand_copies below)."""
        return [t for t in self.tiers if t.kind is TierKind.PEER]


def copy_name(name: str, copy: int) -> str:
    """The name of copy `copy` (2..K) of the peer tier `name` with `copies = K`."""
    return f"{name}.{copy}"


def copy_root(root: str, copy: int) -> str:
    """Its root: the configured root with `.<copy>` appended, a directory of its own next to the
    first copy's on each holder (two tiers sharing a root would see each other's files as their
    own when reconciling and expiring)."""
    return f"{root.rstrip('/') or '/'}.{copy}"


def expand_copies(tiers: list[TierConfig]) -> list[TierConfig]:
    """The tiers with each peer tier of `copies = K` followed by its copies 2..K, each a peer tier
    of its own (`copy_name`, `copy_root`). A list already expanded (a dumped one, which repeats
    the copies) expands to itself: a copy it lists is kept as it is, in its place after its tier."""
    listed = {t.name: t for t in tiers if t.copy_of is not None}
    configured = [t for t in tiers if t.copy_of is None]
    names = {t.name for t in configured}
    out: list[TierConfig] = []
    for t in configured:
        out.append(t)
        for k in range(2, t.copies + 1):
            name = copy_name(t.name, k)
            if name in names:
                raise ValueError(
                    f"peer tier {t.name!r} has copies = {t.copies}: its copy {k} is the tier "
                    f"{name!r}, which is configured too; rename that tier"
                )
            if not NAME_RE.match(name):
                raise ValueError(
                    f"peer tier {t.name!r} has copies = {t.copies}: its copy {k} would be named "
                    f"{name!r}, longer than tier names may be (128 characters); shorten the name"
                )
            copy = listed.pop(name, None)
            if copy is None:
                assert t.root is not None
                copy = TierConfig.model_validate(
                    {
                        **t.model_dump(),
                        "name": name,
                        "root": copy_root(t.root, k),
                        "copy_of": t.name,
                        "copy_number": k,
                    }
                )
            elif (copy.copy_of, copy.copy_number, copy.copies) != (t.name, k, t.copies):
                raise ValueError(
                    f"tier {name!r} says it is copy {copy.copy_number} of {copy.copy_of!r} "
                    f"with copies = {copy.copies}; copy {k} of {t.name!r} is named so"
                )
            out.append(copy)
    if listed:
        stray = next(iter(listed.values()))
        raise ValueError(
            f"tier {stray.name!r} is listed as copy {stray.copy_number} of {stray.copy_of!r}, "
            "which is no peer tier with that many copies; leave copy_of out, or set copies on "
            "that tier"
        )
    return out
