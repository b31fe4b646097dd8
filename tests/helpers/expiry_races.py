"""The set-up of the races against a retention expiry that the catalog's own row locks order
rather than timing (tests/api/test_expiry_races.py, tests/api/test_timeline_races.py): the real
`begin_expiry` holds a checkpoint's row (and has flipped a copy to `expiring`) while a request
waits for it, and "a request waits" is read off Postgres' own lock waits."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import httpx
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from tierpoint.catalog.tier_copy.expiry import begin_expiry
from tierpoint.contract.retention import BeginResult, BeginState
from tierpoint.retention.policy import TierRef
from tierpoint.tier_config import TierKind

TIERS = (
    TierRef("ssd", TierKind.LOCAL),
    TierRef("lustre", TierKind.SHARED),
    TierRef("s3", TierKind.S3),
)
# The newest checkpoint on ssd and lustre; s3 keeps everything.
NEWEST_ON_FAST_TIERS = {"tiers": {"ssd": {"keep_last": 1}, "lustre": {"keep_last": 1}}}
WAIT_LIMIT = 60.0  # seconds: only a bound on a hang, never a timing assertion


def lock_waiters(catalog: Engine) -> int:
    with catalog.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE wait_event_type = 'Lock' AND datname = current_database()"
                )
            ).scalar_one()
        )


async def until_waiting(catalog: Engine, other: asyncio.Future[Any]) -> None:
    """Until some backend waits for a row lock; fails if `other` finished without waiting."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_LIMIT
    while loop.time() < deadline:
        if other.done():
            raise AssertionError(f"finished without waiting for the row lock: {other.result()}")
        if await asyncio.to_thread(lock_waiters, catalog):
            return
        await asyncio.sleep(0.05)
    raise AssertionError("neither waited for the row lock nor finished")


@contextmanager
def begun(catalog: Engine, job: str, cid: int, tier: str) -> Iterator[Session]:
    """The retention executor's begin, uncommitted: it holds the checkpoint's row and its tier
    copies and has flipped `tier`'s to `expiring`. Committed when the block ends."""
    with Session(catalog) as s:
        result = begin_expiry(s, job, cid, tier, TIERS, datetime.now(UTC))
        assert result.state is BeginState.EXPIRING, result
        yield s
        s.commit()


async def during_begin(
    catalog: Engine, job: str, cid: int, tier: str, call: Awaitable[httpx.Response]
) -> httpx.Response:
    """`call` made while the begin holds the row; the begin commits once `call` waits for it."""
    with begun(catalog, job, cid, tier):
        request = asyncio.ensure_future(call)
        await until_waiting(catalog, request)
    return await asyncio.wait_for(request, WAIT_LIMIT)


def begin_judged(catalog: Engine, job: str, cid: int, tier: str) -> BeginResult:
    """What retention's begin would decide now; rolled back, so nothing is deleted."""
    with Session(catalog) as s:
        result = begin_expiry(s, job, cid, tier, TIERS, datetime.now(UTC))
        s.rollback()
    return result


def begin_now(catalog: Engine, job: str, cid: int, tier: str) -> BeginResult:
    """Retention's begin, committed."""
    with Session(catalog) as s:
        result = begin_expiry(s, job, cid, tier, TIERS, datetime.now(UTC))
        s.commit()
    return result
