"""`tierpoint api`: where it listens, how it authenticates, and the limits on what it accepts."""

from __future__ import annotations

from pathlib import Path
from typing import Self

from pydantic import BaseModel, Field, PositiveInt, model_validator


class ApiSettings(BaseModel):
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

    @model_validator(mode="after")
    def _api_tls_pair(self) -> Self:
        if (self.api_tls_cert is None) != (self.api_tls_key is None):
            raise ValueError("api_tls_cert and api_tls_key go together")
        if self.api_tls_client_ca is not None and self.api_tls_cert is None:
            raise ValueError("api_tls_client_ca needs api_tls_cert and api_tls_key")
        return self
