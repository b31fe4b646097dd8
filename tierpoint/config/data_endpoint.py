"""`tierpoint worker --node`: the node's data endpoint, which serves its local and peer tier
files to peers and restores, and the failure domain its worker reports."""

from __future__ import annotations

from pathlib import Path
from typing import Self

from pydantic import BaseModel, Field, PositiveInt, SecretStr, model_validator


class DataEndpointSettings(BaseModel):
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

    @model_validator(mode="after")
    def _data_tls_pairs(self) -> Self:
        if (self.data_tls_cert is None) != (self.data_tls_key is None):
            raise ValueError("data_tls_cert and data_tls_key go together")
        if (self.data_tls_client_cert is None) != (self.data_tls_client_key is None):
            raise ValueError("data_tls_client_cert and data_tls_client_key go together")
        return self

    def domain_of(self, node: str) -> str | None:
        """The failure domain this worker reports for `node` (`failure_domain`)."""
        if isinstance(self.failure_domain, dict):
            return self.failure_domain.get(node)
        return self.failure_domain
