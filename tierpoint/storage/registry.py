"""One entry point from a tier's configuration to its backend."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import boto3
from botocore.config import Config

from tierpoint.storage.base import TierStore
from tierpoint.storage.posix.store import PosixStore
from tierpoint.storage.s3.credentials import credentials_identity, tier_session
from tierpoint.storage.s3.layout import KeyLayout
from tierpoint.storage.s3.store import S3Store
from tierpoint.storage.throttle import TokenBucket
from tierpoint.tier_config import RetryMode, TierConfig, TierKind

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

_lock = threading.Lock()
_clients: dict[tuple[object, ...], S3Client] = {}
_limiters: dict[tuple[str, str | None, int], TokenBucket] = {}


def s3_client(
    endpoint_url: str | None,
    region: str,
    max_pool_connections: int = 32,
    retry_mode: RetryMode = RetryMode.STANDARD,
    max_attempts: int = 6,
    credentials: TierConfig | None = None,
) -> S3Client:
    """A cached client per endpoint, settings and credentials: clients are thread-safe, building
    one costs ~50 ms. With `adaptive` retries the client's rate limiter is shared by every copy of
    the process that talks to this endpoint, as S3's per-prefix limits are.

    Credentials are those the tier `credentials` names (`tierpoint.storage.s3.credentials`), else
    the standard AWS chain (environment, profile, instance role).
    """
    who = credentials_identity(credentials) if credentials is not None else None
    key = (endpoint_url, region, max_pool_connections, retry_mode, max_attempts, who)
    with _lock:
        client = _clients.get(key)
        if client is None:
            config = Config(
                max_pool_connections=max_pool_connections,
                retries={
                    "mode": "adaptive" if retry_mode is RetryMode.ADAPTIVE else "standard",
                    "total_max_attempts": max_attempts,
                },
                tcp_keepalive=True,
                # We send CRC32C ourselves; do not let botocore add a CRC32 of its own.
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
                # Custom endpoints (MinIO, RGW, moto) rarely have wildcard DNS for buckets.
                s3={"addressing_style": "path"} if endpoint_url else None,
            )
            # A session per client: sessions are not thread-safe, clients are.
            session = tier_session(credentials) if credentials is not None else _chain()
            client = session.client(
                "s3", endpoint_url=endpoint_url, region_name=region, config=config
            )
            _clients[key] = client
        return client


def _chain() -> boto3.session.Session:
    return boto3.session.Session()


def read_limiter(tier: TierConfig, node_id: str | None) -> TokenBucket | None:
    """The bandwidth limiter shared by every reader of this tier on this node (None = off)."""
    if tier.read_bandwidth_limit <= 0:
        return None
    key = (tier.name, node_id, tier.read_bandwidth_limit)
    with _lock:
        limiter = _limiters.get(key)
        if limiter is None:
            limiter = _limiters[key] = TokenBucket(tier.read_bandwidth_limit)
        return limiter


def open_store(
    tier: TierConfig, node_id: str | None, layout: KeyLayout | None = None, threads: int = 0
) -> TierStore:
    """The backend of a tier; a local tier is per node and needs node_id. An S3 store names
    objects only once it has a key layout (`layout`, or `keyed` later): the one the catalog
    recorded for the checkpoint at hand. `threads`: how many threads of the process may use it
    at once, each keeping one of the S3 client's connections while its request runs."""
    limiter = read_limiter(tier, node_id)
    if tier.kind is TierKind.S3:
        # A request beyond the pool opens a connection of its own and closes it after: a process
        # serving 250 nodes' queues on 250 threads did that for one S3 request in eleven.
        pool = max(32, tier.multipart_concurrency * tier.parallelism * 2, threads)
        client = s3_client(
            tier.endpoint_url, tier.region, pool, tier.retry_mode, tier.max_attempts, tier
        )
        return S3Store(tier, client, limiter=limiter, layout=layout)
    return PosixStore(tier, node_id, limiter=limiter)


def keyed(store: TierStore, layout: KeyLayout) -> TierStore:
    """`store` naming S3 objects as `layout` does; POSIX stores have one layout and are returned
    as they are."""
    return store.with_layout(layout) if isinstance(store, S3Store) else store
