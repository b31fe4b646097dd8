"""The settings of a dev stack: its services' addresses and its tiers (tiers.py)."""

from __future__ import annotations

import secrets

from tierpoint.config import Settings
from tierpoint.tier_config import TierConfig


def build_settings(
    *, database_url: str, temporal_address: str, tiers: list[TierConfig], api_port: int
) -> Settings:
    return Settings(
        database_url=database_url,
        temporal_address=temporal_address,
        tiers=tiers,
        api_host="127.0.0.1",
        api_port=api_port,
        # Metrics name every job, so they are never on the API's port: a free loopback port of
        # their own, written to stack.json as `metrics_url`.
        api_metrics_port=0,
        # The worker credential of the nodes' data endpoints (a peer tier's copies pull through
        # them): one per stack, held by its in-process workers only.
        data_token=secrets.token_urlsafe(32),
    )
