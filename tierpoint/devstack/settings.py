"""The settings of a dev stack: its services' addresses and its three tiers."""

from __future__ import annotations

from tierpoint.config import Settings, TierConfig, TierKind
from tierpoint.devstack.facts import S3Facts
from tierpoint.devstack.paths import StackPaths


def build_settings(
    paths: StackPaths, *, database_url: str, temporal_address: str, s3: S3Facts, api_port: int
) -> Settings:
    """The dev stack's tiers as the seed names them: ssd (local) -> lustre (shared) -> s3."""
    return Settings(
        database_url=database_url,
        temporal_address=temporal_address,
        tiers=[
            TierConfig(name="ssd", kind=TierKind.LOCAL, root=paths.local_root_template),
            TierConfig(name="lustre", kind=TierKind.SHARED, root=str(paths.lustre)),
            TierConfig(
                name="s3",
                kind=TierKind.S3,
                bucket=s3.bucket,
                endpoint_url=s3.endpoint_url,
                region=s3.region,
            ),
        ],
        api_host="127.0.0.1",
        api_port=api_port,
        # Metrics name every job, so they are never on the API's port: a free loopback port of
        # their own, written to stack.json as `metrics_url`.
        api_metrics_port=0,
    )
