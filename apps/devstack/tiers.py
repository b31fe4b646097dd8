"""The dev stack's tiers: the user's list, read where every process reads its settings
(`tierpoint dev --tiers FILE` first, then TIERPOINT_TIERS, then the config file's `[[tiers]]`),
with only what the user left out filled in by the dev stack: a root under the data dir for a
POSIX tier without one, its own S3 endpoint and bucket for an s3 tier without them (and then its
S3's keys, by `credentials_env`: a tier of another endpoint never gets them). Without a
list, the seed's ssd (local) -> lustre (shared) -> s3."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_settings import EnvSettingsSource, TomlConfigSettingsSource

from apps.devstack.facts import BUCKET, S3_CREDENTIALS_ENV, S3Facts
from apps.devstack.paths import StackPaths
from tierpoint.config import Settings
from tierpoint.tier_config import TierConfig, TierKind

DEFAULT_TIERS: tuple[dict[str, Any], ...] = (
    {"name": "ssd", "kind": "local"},
    {"name": "lustre", "kind": "shared"},
    {"name": "s3", "kind": "s3"},
)
NODE = "{node}"


class DevTiersError(ValueError):
    """A tier list the dev stack cannot run: said in one line, before anything starts."""


@dataclass(frozen=True)
class RequestedTiers:
    tiers: list[dict[str, Any]]
    origin: str  # where the list came from, for the startup output


def _config_file() -> str:
    return str(Settings.model_config.get("toml_file") or "tierpoint.toml")


def requested_tiers(tiers_file: Path | None = None) -> RequestedTiers:
    """The user's tier list as written (not yet complete), and where it came from."""
    if tiers_file is not None:
        try:
            data = tomllib.loads(tiers_file.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise DevTiersError(f"--tiers {tiers_file}: {exc}") from None
        if not data.get("tiers"):
            raise DevTiersError(f"--tiers {tiers_file}: no `tiers` tables in it")
        return RequestedTiers(_tables(data["tiers"], f"--tiers {tiers_file}"), str(tiers_file))
    # The same sources, in the same order, as Settings() reads them.
    for source, origin in (
        (EnvSettingsSource(Settings), "TIERPOINT_TIERS"),
        (TomlConfigSettingsSource(Settings), _config_file()),
    ):
        try:
            tiers = source().get("tiers")
        except (ValueError, tomllib.TOMLDecodeError) as exc:
            raise DevTiersError(f"{origin}: {exc}") from None
        if tiers:
            return RequestedTiers(_tables(tiers, origin), origin)
    return RequestedTiers([dict(t) for t in DEFAULT_TIERS], "default")


def _tables(tiers: Any, origin: str) -> list[dict[str, Any]]:
    if not isinstance(tiers, list) or not all(isinstance(t, dict) for t in tiers):
        raise DevTiersError(f"{origin}: tiers must be a list of tables (name, kind, ...)")
    return [dict(t) for t in tiers]


def complete_tiers(
    requested: list[dict[str, Any]], paths: StackPaths, nodes: int, s3: S3Facts | None
) -> list[TierConfig]:
    """The list with the dev stack's values where the user gave none. `s3`: the stack's S3
    endpoint once it runs (None: only checks the list, before anything starts)."""
    done: list[TierConfig] = []
    for raw in requested:
        tier = dict(raw)
        name = str(tier.get("name", ""))
        kind = tier.get("kind")
        if kind in (TierKind.LOCAL, TierKind.PEER) and not tier.get("root"):
            tier["root"] = str(paths.data_dir / "nodes" / NODE / name)
        elif kind == TierKind.SHARED and not tier.get("root"):
            tier["root"] = str(paths.data_dir / name)
        elif kind == TierKind.S3:
            tier.setdefault("bucket", BUCKET)
            # The stack's own bucket is always on its own endpoint: a list copied from an earlier
            # stack's stack.env names that stack's (dead) port.
            if s3 is not None and (not tier.get("endpoint_url") or tier["bucket"] == BUCKET):
                tier["endpoint_url"] = s3.endpoint_url
                tier["region"] = s3.region
                tier.pop("credentials_profile", None)
                # guard: dev-stack-keys-only-for-its-s3
                tier["credentials_env"] = S3_CREDENTIALS_ENV
        try:
            config = TierConfig(**tier)
        except ValidationError as exc:
            first = exc.errors()[0]
            raise DevTiersError(f"tier {name or '?'}: {first['msg']}") from None
        # guard: dev-nodes-share-a-local-root
        if config.on_nodes and nodes > 1 and NODE not in (config.root or ""):
            raise DevTiersError(
                f"{config.kind} tier {name!r}: its root {config.root} has no {NODE}, but the dev "
                f"stack runs {nodes} nodes on this machine and each needs a root of its own "
                f"(e.g. {config.root}/{NODE})"
            )
        done.append(config)
    try:
        # The list's own rules (unique names, archive tiers last), and the list every process
        # of the stack sees: a peer tier with `copies = K` is K peer tiers.
        done = Settings(tiers=done).tiers
    except ValidationError as exc:
        raise DevTiersError(f"tiers: {exc.errors()[0]['msg']}") from None
    if not any(t.kind is TierKind.LOCAL for t in done):
        raise DevTiersError("the dev stack's nodes write to a local tier: the list has none")
    return done


def on_stack_s3(tier: TierConfig, s3: S3Facts) -> bool:
    """An s3 tier whose objects live in the stack's own (in-memory) S3."""
    return tier.kind is TierKind.S3 and tier.endpoint_url == s3.endpoint_url


def where(tier: TierConfig) -> str:
    """One line: where a tier keeps its copies."""
    if tier.kind is TierKind.S3:
        at = f" at {tier.endpoint_url}" if tier.endpoint_url else ""
        return f"s3://{tier.bucket}/{tier.prefix}{at}"
    return str(tier.root)
