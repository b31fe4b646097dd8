"""Where the services every process connects to are: the catalog and Temporal."""

from __future__ import annotations

from pathlib import Path
from typing import Self

from pydantic import BaseModel, Field, SecretStr, model_validator


class ServicesSettings(BaseModel):
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

    @model_validator(mode="after")
    def _temporal_tls_pair(self) -> Self:
        if (self.temporal_tls_cert is None) != (self.temporal_tls_key is None):
            raise ValueError("temporal_tls_cert and temporal_tls_key go together")
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
