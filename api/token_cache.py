"""The API's cache of token records by digest, so that a request costs no catalog round trip for
its token on the hot path."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from tierpoint.auth import TokenRecord
from tierpoint.catalog.engine import AsyncSessions
from tierpoint.catalog.token import tokens


@dataclass
class TokenCache:
    """Token records by digest for `ttl` seconds; a bounded dict, cleared when full (a token
    flood must not grow memory, and a miss costs one indexed lookup)."""

    ttl: float
    max_entries: int = 4096
    _entries: dict[str, tuple[float, TokenRecord]] = field(default_factory=dict)

    async def record(self, token_digest: str, sessions: AsyncSessions) -> TokenRecord | None:
        now = time.monotonic()
        hit = self._entries.get(token_digest)
        if hit is not None and hit[0] > now:
            return hit[1]
        async with sessions() as session:
            record = await session.run_sync(tokens.token_by_digest, token_digest)
            if record is not None and _touch_due(record):
                await session.run_sync(tokens.touch, record.id)
                # Its own transaction: authentication runs before, and apart from, the
                # request's unit of work (a refused request still counts as the token's use).
                await session.commit()
        if record is None:
            self._entries.pop(token_digest, None)
        elif self.ttl > 0:
            if len(self._entries) >= self.max_entries:
                self._entries.clear()
            self._entries[token_digest] = (now + self.ttl, record)
        return record


def _touch_due(record: TokenRecord) -> bool:
    # The row says when it was last touched: skip the write (a round trip) when that is recent.
    # The UPDATE re-checks the condition in the catalog's clock.
    last = record.last_used_at
    return last is None or datetime.now(UTC) - last >= tokens.TOUCH_EVERY
