"""Settings for every tierpoint process, from environment variables and an optional TOML file.

Tiers are configuration, not code: the ordered list goes from the fastest, most local tier to the
most durable one. A RAM tier is a `local` tier rooted on /dev/shm.
"""

from __future__ import annotations

import os
import re
from datetime import timedelta
from enum import StrEnum
from pathlib import Path
from typing import Any, Self

from pydantic import BaseModel, Field, PositiveInt, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from tierpoint.errors import UnknownTier

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class TierKind(StrEnum):
    LOCAL = "local"
    SHARED = "shared"
    S3 = "s3"


class TierConfig(BaseModel):
    name: str
    kind: TierKind
    # POSIX tiers. A local root may contain "{node}", so one config serves every node.
    root: str | None = None
    # S3 tiers.
    bucket: str | None = None
    prefix: str = ""
    endpoint_url: str | None = None
    region: str = "us-east-1"
    multipart_part_size: PositiveInt = 16 * 1024 * 1024
    multipart_concurrency: PositiveInt = 2
    # How many shard batches copy to this tier at once.
    parallelism: PositiveInt = 4
    # Reads off a local tier are throttled so that copies do not starve training (bytes/s, 0 = off).
    read_bandwidth_limit: int = Field(default=0, ge=0)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.match(v):
            raise ValueError("tier names are URL-safe: [A-Za-z0-9][A-Za-z0-9._-]{0,127}")
        return v

    @model_validator(mode="after")
    def _location(self) -> Self:
        if self.kind is TierKind.S3:
            if not self.bucket:
                raise ValueError(f"s3 tier {self.name!r} needs a bucket")
        elif not self.root:
            raise ValueError(f"{self.kind} tier {self.name!r} needs a root")
        return self

    def root_for(self, node_id: str | None) -> Path:
        assert self.root is not None
        if self.kind is TierKind.LOCAL:
            if node_id is None:
                raise ValueError(f"local tier {self.name!r} is per node: a node id is needed")
            return Path(self.root.replace("{node}", node_id))
        return Path(self.root)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="TIERPOINT_",
        env_nested_delimiter="__",
        toml_file=os.environ.get("TIERPOINT_CONFIG_FILE", "tierpoint.toml"),
        extra="ignore",
    )

    database_url: str = "postgresql+psycopg://postgres@127.0.0.1:5432/tierpoint"
    temporal_address: str = "127.0.0.1:7233"
    temporal_namespace: str = "default"
    tiers: list[TierConfig] = Field(default_factory=list)
    node_id: str | None = None
    api_host: str = "127.0.0.1"
    api_port: int = 8080
    # Registration limits (invariant 6: oversized manifests are refused before anything is written).
    max_shards_per_checkpoint: PositiveInt = 200_000
    max_manifest_bytes: PositiveInt = 64 * 1024 * 1024
    # Workflow shape: history grows with batches, never with shards.
    shard_batch_size: PositiveInt = 500
    max_batches_per_stage: PositiveInt = 64
    # Catalog progress writes per replica at most this often.
    progress_interval_seconds: float = 1.0
    # A batch activity (seal, copy) whose worker has not heartbeated for this long is retried
    # elsewhere, resuming from its last heartbeat: how long a killed worker's copy waits. Progress
    # is reported per chunk (8 MiB on POSIX), so a chunk at the slowest read_bandwidth_limit must
    # arrive well within it.
    batch_heartbeat_timeout_seconds: float = Field(default=60.0, gt=0)
    reconcile_interval_seconds: float = 10.0
    # How often the retention sweep schedule requests a retention run for every job (time-based
    # rules such as keep_within change their answer without any promotion).
    retention_sweep_interval: timedelta = timedelta(minutes=10)
    log_json: bool = False
    log_level: str = "INFO"

    @field_validator("tiers")
    @classmethod
    def _tiers(cls, tiers: list[TierConfig]) -> list[TierConfig]:
        names = [t.name for t in tiers]
        if len(set(names)) != len(names):
            raise ValueError("tier names must be unique")
        return tiers

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls))

    def tier(self, name: str) -> TierConfig:
        for t in self.tiers:
            if t.name == name:
                return t
        raise UnknownTier(
            f"tier {name!r} is not configured; tiers are {', '.join(self.tier_names())}"
        )

    def tier_names(self) -> list[str]:
        return [t.name for t in self.tiers]

    def local_tier(self) -> TierConfig | None:
        return next((t for t in self.tiers if t.kind is TierKind.LOCAL), None)

    def public_dict(self) -> dict[str, Any]:
        """Settings safe to print: no credentials in URLs."""
        data = self.model_dump(mode="json")
        data["database_url"] = re.sub(r"//([^:@/]+):[^@/]*@", r"//\1:***@", self.database_url)
        return data
