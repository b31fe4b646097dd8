"""Who may read what over a node's data endpoint: the credential, its scopes, the files the node
serves (a listing per checkpoint, from the catalog) and the byte range asked for.

The credential is checked before anything else of the request: a request without a valid one is
401 whatever its path, so a stranger learns nothing of the endpoint's rules from a 400. Then the
path (400), then whether the credential covers the job (403).
"""

from __future__ import annotations

import hmac
import re
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from tierpoint import auth
from tierpoint.catalog.engine import Sessions
from tierpoint.catalog.replica import placement
from tierpoint.catalog.stripe.encoding import staged_size
from tierpoint.catalog.stripe.restoring import held_size
from tierpoint.catalog.token import tokens
from tierpoint.config import Settings
from tierpoint.errors import (
    InsufficientScope,
    InvalidDataPath,
    InvalidToken,
    RangeNotSatisfiable,
    Unauthenticated,
    UnsafePath,
)
from tierpoint.storage.base import ShardRef, TierStore
from tierpoint.storage.peer_http import parse_data_path
from tierpoint.storage.posix.staging import StripeStaging
from tierpoint.storage.registry import open_store
from tierpoint.tier_config import TierConfig

_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")
# How long a checkpoint's listing of served files answers for it (see data_endpoint's docstring).
LISTING_TTL = 1.0
# Checkpoints whose listing is kept at once; beyond it, the oldest is dropped.
LISTINGS = 64


@dataclass(frozen=True)
class Caller:
    """Who a request acts as: the cluster's worker credential (`principal` None), which reads
    every job, or an API token."""

    name: str
    principal: auth.Principal | None

    def check(self, job: str) -> None:
        """InsufficientScope (403) unless the credential covers `job`."""
        who = self.principal
        # guard: data-endpoint-scope
        if who is not None and not (who.has(auth.Scope.READ) or who.trains(job)):
            raise InsufficientScope(
                f"token {who.name!r} may not read job {job!r}", required=f"train:{job}"
            )


def authenticate(sessions: Sessions, settings: Settings, header: str | None) -> Caller:
    """The caller of a request with this `Authorization` header: Unauthenticated or InvalidToken
    (401) without a valid credential."""
    scheme, _, secret = (header or "").partition(" ")
    if scheme.lower() != "bearer" or not secret:
        raise Unauthenticated("a bearer credential is required")
    worker = settings.data_token
    # guard: data-endpoint-worker-credential
    if worker is not None and hmac.compare_digest(
        secret.encode(), worker.get_secret_value().encode()
    ):
        return Caller("worker", None)
    with sessions.begin() as s:
        record = tokens.token_by_digest(s, auth.digest(secret))
    if record is None:
        raise InvalidToken("unknown credential")
    who = auth.principal_of(record, datetime.now(UTC))
    return Caller(who.name, who)


def data_path(raw: str) -> tuple[str, ShardRef]:
    """(tier, shard) of a request path, InvalidDataPath (400) for anything else."""
    try:
        return parse_data_path(raw)
    except (UnsafePath, ValueError) as exc:
        raise InvalidDataPath(str(exc)) from None


def byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """[start, end) of a single `bytes=` range, None for the whole file; RangeNotSatisfiable
    (416) for one that does not fit."""
    if header is None:
        return None
    m = _RANGE.match(header.strip())
    if m is None:
        raise RangeNotSatisfiable("one bytes=a-b range only")
    start = int(m.group(1))
    end = int(m.group(2)) + 1 if m.group(2) else size
    end = min(end, size)
    if start >= size or end <= start:
        if start == size == 0:
            return 0, 0
        raise RangeNotSatisfiable(f"the file has {size} bytes")
    return start, end


def stripe_source(
    sessions: Sessions, tier: TierConfig, node: str, index: int, ref: ShardRef
) -> tuple[TierStore, int | None]:
    """Where `node` serves stripe `index` of shard `ref` from, and its size (None: not served).
    The shard's own node serves it from its staging area while the catalog has it placed for
    its holder (the holder's pull); its holder serves it from its root of the tier while it
    holds it verified (a restore). A holder is never the shard's node, so at most one applies.
    Only a coded tier keeps stripes."""
    staging = StripeStaging(tier, node)
    code = tier.stripe_code
    if code is None or index >= code.width:
        return staging.store(index), None
    with sessions.begin() as s:
        size = staged_size(s, node, tier.name, index, ref.job, ref.step, ref.branch, ref.path)
        if size is not None:
            return staging.store(index), size
        held = held_size(s, node, tier.name, index, ref.job, ref.step, ref.branch, ref.path)
    return open_store(tier, node), held


class Listings:
    """The verified copies `node` holds of recently read checkpoints, per (tier, job, step,
    branch)."""

    def __init__(self, sessions: Sessions, node: str, ttl: float = LISTING_TTL) -> None:
        self.sessions, self.node, self.ttl = sessions, node, ttl
        self._lock = threading.Lock()
        self._listed: dict[tuple[str, str, int, int], tuple[float, dict[str, int]]] = {}
        self._loading: dict[tuple[str, str, int, int], threading.Lock] = {}

    def size(self, tier: str, job: str, step: int, path: str, branch: int = 1) -> int | None:
        """The size of the file if this node serves it (a verified copy on `tier`), else None."""
        key = (tier, job, step, branch)
        found = self._cached(key, path)
        if found is not None:
            return found
        # One query per checkpoint at a time: the first files of a restore are asked for at
        # once, and the others wait for its listing rather than each making their own.
        with self._lock:
            loading = self._loading.setdefault(key, threading.Lock())
        with loading:
            try:
                found = self._cached(key, path)
                if found is not None:
                    return found
                listed_at = time.monotonic()
                with self.sessions.begin() as s:
                    listed = placement.served_sizes(s, self.node, tier, job, step, branch)
                with self._lock:
                    self._listed.pop(key, None)
                    while len(self._listed) >= LISTINGS:
                        del self._listed[next(iter(self._listed))]
                    self._listed[key] = (listed_at, listed)
            finally:
                with self._lock:
                    self._loading.pop(key, None)
        return listed.get(path)

    def _cached(self, key: tuple[str, str, int, int], path: str) -> int | None:
        with self._lock:
            hit = self._listed.get(key)
        if hit is None or time.monotonic() - hit[0] >= self.ttl:
            return None
        return hit[1].get(path)

    def forget(self, tier: str, job: str, step: int, branch: int = 1) -> None:
        """Drop the checkpoint's listing: a copy in it was found bad."""
        with self._lock:
            self._listed.pop((tier, job, step, branch), None)
