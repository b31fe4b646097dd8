"""The filesystem's settings: storage options (which fsspec also fills from the environment's
`FSSPEC_TIERPOINT_<KEY>` variables), else tierpoint's own `TIERPOINT_*` variables. Nothing is
checked when fsspec builds the filesystem (DCP treats any error there as "not a URL of mine" and
answers an unhelpful "Cannot detect which StorageReader or StorageWriter to use"): a missing
setting is a ConfigurationError at the first operation that needs it, before anything is
written."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Any

from tierpoint_client.client import Client
from tierpoint_client.errors import ConfigurationError
from tierpoint_client.torch._files import NODE_ENV

# Seconds a read's restore lease lasts if this process dies without releasing it.
DEFAULT_LEASE_TTL = 1800


@dataclass(frozen=True)
class Settings:
    api_url: str | None
    token: str | None = field(default=None, repr=False)
    node: str | None = None
    lease_ttl: int = DEFAULT_LEASE_TTL

    @classmethod
    def of(cls, options: dict[str, Any]) -> Settings:
        def pick(key: str, env: str) -> str | None:
            value = options.get(key)
            return str(value) if value not in (None, "") else os.environ.get(env) or None

        ttl = options.get("lease_ttl")
        return cls(
            api_url=pick("api_url", "TIERPOINT_API_URL"),
            token=pick("token", "TIERPOINT_TOKEN"),
            node=pick("node", NODE_ENV),
            lease_ttl=int(ttl) if ttl not in (None, "") else DEFAULT_LEASE_TTL,
        )

    def require_node(self) -> str:
        if self.node is None:
            raise ConfigurationError(
                f"tierpoint:// cannot write: this node's id is unknown; set {NODE_ENV} (or "
                "FSSPEC_TIERPOINT_NODE) to the id its tierpoint node worker reports"
            )
        return self.node


_clients: dict[Settings, Client] = {}
_lock = threading.Lock()


def client_for(settings: Settings) -> Client:
    if settings.api_url is None:
        raise ConfigurationError(
            "tierpoint:// needs the API: set TIERPOINT_API_URL (or FSSPEC_TIERPOINT_API_URL)"
        )
    if settings.token is None:
        raise ConfigurationError(
            "tierpoint:// needs a token: set TIERPOINT_TOKEN (or FSSPEC_TIERPOINT_TOKEN) to a "
            "token with the scope train:<job> of the job it saves"
        )
    with _lock:
        found = _clients.get(settings)
        if found is None:
            found = _clients[settings] = Client(settings.api_url, token=settings.token)
        return found
