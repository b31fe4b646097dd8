"""Settings for every tierpoint process, from environment variables and an optional TOML file.

Tiers are configuration, not code: the ordered list goes from the fastest, most local tier to the
most durable one (each one's options: tierpoint.tier_config). A RAM tier is a `local` tier rooted
on /dev/shm.
"""

from __future__ import annotations

import os
import re
from datetime import timedelta
from pathlib import Path
from typing import Any, Self

from pydantic import Field, PositiveInt, SecretStr, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from tierpoint.errors import UnknownTier
from tierpoint.tier_config import TierConfig, TierKind, expand_copies


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="TIERPOINT_",
        env_nested_delimiter="__",
        toml_file=os.environ.get("TIERPOINT_CONFIG_FILE", "tierpoint.toml"),
        extra="ignore",
    )

    database_url: str = Field(
        default="postgresql+psycopg://postgres@127.0.0.1:5432/tierpoint",
        description="The catalog's SQLAlchemy URL (Postgres, psycopg 3). Holds credentials: "
        "keep it in a secret.",
    )
    temporal_address: str = Field(
        default="127.0.0.1:7233", description="The Temporal frontend, `host:port`."
    )
    temporal_namespace: str = Field(default="default", description="The Temporal namespace.")
    temporal_rpc_timeout: float = Field(
        default=5.0,
        gt=0,
        le=300,
        description="`tierpoint api`: deadline in seconds of each call the API makes to Temporal; "
        "a request whose call misses it (a stalled or overloaded server) answers 503 "
        "`temporal_unavailable` instead of hanging.",
    )
    temporal_tls_cert: Path | None = Field(
        default=None,
        description="mTLS to Temporal: this process's client certificate (PEM file); with "
        "`temporal_tls_key`. Setting any `temporal_tls_*` turns TLS on.",
    )
    temporal_tls_key: Path | None = Field(
        default=None, description="mTLS to Temporal: the client certificate's private key (PEM)."
    )
    temporal_tls_ca: Path | None = Field(
        default=None,
        description="TLS to Temporal: the CA bundle (PEM) that signed the server's certificate; "
        "unset: the system roots.",
    )
    temporal_tls_server_name: str | None = Field(
        default=None, description="TLS to Temporal: the server name to verify, if not the host."
    )
    temporal_api_key: SecretStr | None = Field(
        default=None,
        description="An API key for Temporal (e.g. Temporal Cloud); turns TLS on. A secret: "
        "set it in the environment, never in the TOML file.",
    )
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
    api_host: str = Field(default="127.0.0.1", description="`tierpoint api`: bind address.")
    api_port: int = Field(default=8080, description="`tierpoint api`: port.")
    api_tls_cert: Path | None = Field(
        default=None,
        description="`tierpoint api`: the server certificate (PEM, chain after it); with "
        "`api_tls_key` the API speaks HTTPS only and a plain-HTTP request gets no answer.",
    )
    api_tls_key: Path | None = Field(
        default=None, description="`tierpoint api`: the private key (PEM) of `api_tls_cert`."
    )
    api_tls_client_ca: Path | None = Field(
        default=None,
        description="`tierpoint api` with `api_tls_cert`: admit only clients presenting a "
        "certificate this CA bundle signed (mutual TLS); the bearer token still applies.",
    )
    api_metrics_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="`tierpoint api`: serve Prometheus /metrics on this port, a listener of its "
        "own apart from the API (unset: none). The metrics name every job: expose the port to "
        "the scraper only.",
    )
    api_metrics_host: str = Field(
        default="127.0.0.1",
        description="`tierpoint api`: bind address of /metrics (`0.0.0.0` in a pod).",
    )
    insecure_no_auth: bool = Field(
        default=False,
        description="`tierpoint api`: serve every route WITHOUT authentication, every caller "
        "acting as `anonymous` with admin rights. Only for a closed test network; the API logs "
        "a warning at start.",
    )
    token_cache_seconds: float = Field(
        default=30.0,
        ge=0,
        le=300,
        description="The API keeps a looked-up token this long before asking the catalog "
        "again: a revocation takes effect within this time (0: ask on every request).",
    )
    # Registration limits (invariant 6: oversized manifests are refused before anything is written).
    max_shards_per_checkpoint: PositiveInt = Field(
        default=200_000,
        description="Registration refuses a manifest with more shards than this (4xx, "
        "nothing written).",
    )
    max_manifest_bytes: PositiveInt = Field(
        default=64 * 1024 * 1024,
        description="Registration refuses a manifest (request body) larger than this (bytes).",
    )
    max_metadata_bytes: PositiveInt = Field(
        default=64 * 1024,
        description="Registration refuses a manifest whose `metadata`, serialized as compact "
        "JSON, is larger than this (bytes; 413 `manifest_too_large`, nothing written).",
    )
    max_request_bytes: PositiveInt = Field(
        default=1024 * 1024,
        description="Every endpoint but registration refuses a request body larger than this "
        "(bytes; 413 `request_too_large`), before reading it.",
    )
    # Workflow shape: history grows with batches, never with shards.
    shard_batch_size: PositiveInt = Field(
        default=500,
        description="Smallest number of shards per batch activity; batches are "
        "`max(shard_batch_size, ceil(S / max_batches_per_stage))` shards of one node.",
    )
    max_batches_per_stage: PositiveInt = Field(
        default=64,
        description="Target number of batches per stage (per node at least one).",
    )
    # A node with fewer batches than its stages' parallelism would copy its shards one after
    # another inside one activity; large shards are worth an activity each, tiny ones are not.
    min_batch_bytes: PositiveInt = Field(
        default=64 * 1024 * 1024,
        description="A node with fewer batches than the `parallelism` of the first two tiers "
        "(the stages on the nodes' queues) has its shards split into up to that many "
        "contiguous ranges balanced by bytes, none smaller than this (bytes).",
    )
    progress_interval_seconds: float = Field(
        default=1.0,
        description="Catalog progress writes (`replica.bytes_done`) per batch at most this "
        "often (seconds).",
    )
    # Progress is reported per chunk (8 MiB on POSIX), so a chunk at the slowest
    # read_bandwidth_limit must arrive well within it.
    batch_heartbeat_timeout_seconds: float = Field(
        default=60.0,
        gt=0,
        description="A batch activity (seal, copy) whose worker has not heartbeated for this "
        "long is retried elsewhere, resuming from its last heartbeat: how long a killed "
        "worker's copy waits (seconds). Keep it well above 8 MiB / read_bandwidth_limit.",
    )
    reconcile_interval_seconds: float = Field(
        default=10.0,
        description="How often the shared worker's reconciler starts the workflows of "
        "registered checkpoints that have none (seconds).",
    )
    # Time-based rules such as keep_within change their answer without any promotion.
    retention_sweep_interval: timedelta = Field(
        default=timedelta(minutes=10),
        description="How often the retention sweep schedule requests a retention run for "
        "every job (ISO 8601 duration or seconds).",
    )
    scrub_enabled: bool = Field(
        default=True,
        description="Whether the shared worker keeps the `tierpoint.scrub` schedule, which reads "
        "verified replicas back and repairs the ones found bad (docs/integrity.md).",
    )
    scrub_interval: timedelta = Field(
        default=timedelta(minutes=10),
        gt=timedelta(0),
        description="How often a scrub run starts; each reads at most `scrub_bandwidth` x this "
        "interval bytes per tier (per node for a local tier).",
    )
    scrub_min_age: timedelta = Field(
        default=timedelta(days=7),
        ge=timedelta(0),
        description="A verified replica is read back again at most once per this period "
        "(counted from its last verification or scrub).",
    )
    reconcile_schedule_interval: timedelta | None = Field(
        default=None,
        description="If set, a `tierpoint.reconcile` schedule compares the catalog with every "
        "tier this often and repairs what it finds (off by default: it lists whole tiers).",
    )
    reconcile_grace: timedelta = Field(
        default=timedelta(hours=1),
        ge=timedelta(0),
        description="Temp files and multipart uploads older than this that no copy is writing "
        "are abandoned: reconciliation reports them and, with repair, removes them.",
    )
    data_host: str = Field(
        default="127.0.0.1",
        description="`tierpoint worker --node`: bind address of the node's data endpoint, which "
        "serves the node's local and peer tier files to peers and restores (docs/security.md). "
        "Served when a peer tier is configured or `data_port` is set.",
    )
    data_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="`tierpoint worker --node`: port of the data endpoint (unset or 0: a free "
        "port, reported to the catalog; a worker serving several nodes always takes free ports).",
    )
    data_url: str | None = Field(
        default=None,
        description="The data endpoint's address as other nodes reach it (`http://host:port`), "
        "when it is not `http://data_host:port` (behind NAT, or bound to 0.0.0.0).",
    )
    failure_domain: str | dict[str, str] | None = Field(
        default=None,
        description="`tierpoint worker --node`: the failure domain of this worker's node (a rack, "
        "a zone: what fails together), reported with its heartbeat; or a table node -> domain "
        "for a worker serving several nodes. Peer placement puts a node's copies in other "
        "domains than its own, and in distinct ones while there are enough. Unset: the node is "
        "a domain of its own.",
    )
    data_token: SecretStr | None = Field(
        default=None,
        description="The worker credential of the data endpoint: a node pulling a peer copy "
        "sends it; an endpoint accepts it or an API token whose scopes cover the job. Every "
        "worker of a cluster holds the same one. A secret: set it in the environment.",
    )
    data_tls_cert: Path | None = Field(
        default=None,
        description="`tierpoint worker --node`: the data endpoint's certificate (PEM, the chain "
        "first); with `data_tls_key` the endpoint speaks HTTPS only, and its URL is `https://`.",
    )
    data_tls_key: Path | None = Field(
        default=None, description="The data endpoint certificate's private key (PEM)."
    )
    data_tls_ca: Path | None = Field(
        default=None,
        description="The CA bundle (PEM) a worker verifies other nodes' HTTPS data endpoints "
        "against when it pulls a peer copy; unset: the system roots. With "
        "`data_tls_client_auth`, also the CAs whose client certificates the endpoint admits.",
    )
    data_tls_client_auth: bool = Field(
        default=False,
        description="`tierpoint worker --node`: mutual TLS. The data endpoint admits only "
        "clients presenting a certificate that `data_tls_ca` signed (unexpired, usable for "
        "client authentication) and refuses any other at the handshake, before it reads a "
        "request; the bearer credential still applies on top. Needs `data_tls_cert`, "
        "`data_tls_key` and `data_tls_ca`; a node worker then refuses to start without its own "
        "`data_tls_client_cert`/`data_tls_client_key`, since its peers require one too.",
    )
    data_tls_client_cert: Path | None = Field(
        default=None,
        description="The client certificate (PEM, the chain first) a worker presents to other "
        "nodes' HTTPS data endpoints when it pulls from them (peer copies, re-replication, "
        "repair). The training client reads the same variable.",
    )
    data_tls_client_key: Path | None = Field(
        default=None, description="The private key (PEM) of `data_tls_client_cert`."
    )
    data_header_timeout: float = Field(
        default=10.0,
        gt=0,
        description="`tierpoint worker --node`: a connection to the data endpoint must complete "
        "its TLS handshake, request line and headers within this many seconds of its accept "
        "(a kept-alive one: of its next request's first byte); one deadline for all of it, so a "
        "client sending a byte at a time is cut off too (docs/security.md).",
    )
    data_idle_timeout: float = Field(
        default=30.0,
        gt=0,
        description="`tierpoint worker --node`: a kept-alive data endpoint connection with no "
        "next request for this many seconds is closed, and so is a response whose reader takes "
        "no byte for as long.",
    )
    data_max_connections: PositiveInt = Field(
        default=256,
        description="`tierpoint worker --node`: connections the data endpoint holds at once "
        "(a thread and a descriptor each). At the cap a new connection takes the slot of the "
        "one that has waited longest for a request; when every slot is answering one, the new "
        "connection is closed.",
    )
    worker_metrics_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="`tierpoint worker`: serve Prometheus /metrics on this port (unset: none).",
    )
    worker_metrics_host: str = Field(
        default="127.0.0.1",
        description="`tierpoint worker`: bind address of /metrics (`0.0.0.0` in a pod).",
    )
    metrics_refresh_seconds: float = Field(
        default=15.0,
        gt=0,
        description="`tierpoint api`: how often the catalog gauges of /metrics (recovery point "
        "age, checkpoints in flight, shared tier free space) are recomputed.",
    )
    log_json: bool = Field(default=False, description="Logs as JSON lines instead of text.")
    log_level: str = Field(default="INFO", description="Log level (`DEBUG`, `INFO`, ...).")

    @model_validator(mode="after")
    def _temporal_tls(self) -> Self:
        if (self.temporal_tls_cert is None) != (self.temporal_tls_key is None):
            raise ValueError("temporal_tls_cert and temporal_tls_key go together")
        if (self.data_tls_cert is None) != (self.data_tls_key is None):
            raise ValueError("data_tls_cert and data_tls_key go together")
        if (self.data_tls_client_cert is None) != (self.data_tls_client_key is None):
            raise ValueError("data_tls_client_cert and data_tls_client_key go together")
        if (self.api_tls_cert is None) != (self.api_tls_key is None):
            raise ValueError("api_tls_cert and api_tls_key go together")
        if self.api_tls_client_ca is not None and self.api_tls_cert is None:
            raise ValueError("api_tls_client_ca needs api_tls_cert and api_tls_key")
        return self

    def temporal_tls(self) -> bool:
        return any(
            v is not None
            for v in (
                self.temporal_tls_cert,
                self.temporal_tls_ca,
                self.temporal_tls_server_name,
            )
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

    def domain_of(self, node: str) -> str | None:
        """The failure domain this worker reports for `node` (`failure_domain`)."""
        if isinstance(self.failure_domain, dict):
            return self.failure_domain.get(node)
        return self.failure_domain

    def peer_tiers(self) -> list[TierConfig]:
        """The peer tiers in order: the i-th (from 1) holds node N's copy on the i-th holder of N's
        placement (activities/placement.py), so K peer tiers keep K copies on K distinct nodes.
        A peer tier with `copies = K` is K of them (tier_config.expand_copies)."""
        return [t for t in self.tiers if t.kind is TierKind.PEER]

    def public_dict(self) -> dict[str, Any]:
        """Settings safe to print: no credentials in URLs."""
        data = self.model_dump(mode="json")
        data["database_url"] = re.sub(r"//([^:@/]+):[^@/]*@", r"//\1:***@", self.database_url)
        return data
