"""The tier copy's state machine on a real catalog: a move changes only tier copies its writer
holds, and of those only the ones in the move's source states."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from tests.helpers.catalog_rows import one_shard_checkpoint
from tierpoint.catalog.locks import Locked, lock_in_order
from tierpoint.catalog.models import TierCopy
from tierpoint.catalog.tier_copy import machine as tier_copies
from tierpoint.catalog.tier_copy.machine import Move


def _state(session: Session, cid: int, tier: str) -> tuple[str, str | None]:
    row = session.execute(
        select(TierCopy.state, TierCopy.reason).where(
            TierCopy.checkpoint_id == cid, TierCopy.tier == tier
        )
    ).one()
    return row.state, row.reason


def test_a_tier_copy_is_moved_only_by_a_writer_holding_its_lock(session: Session) -> None:
    cid, _ = one_shard_checkpoint(session, f"node-{uuid.uuid4().hex[:8]}")
    with pytest.raises(AssertionError, match="without their lock"):
        tier_copies.move(session, Locked(), Move.RETRIED, [(cid, "ssd")])
    held = lock_in_order(session, tier_copies=[(cid, "ssd")])
    # A move's source states bound what it changes: a pending copy is not "retried".
    assert tier_copies.move(session, held, Move.RETRIED, [(cid, "ssd")]) == []
    assert _state(session, cid, "ssd") == ("pending", None)


def test_a_move_goes_from_its_sources_to_its_target_and_keeps_the_reason_unless_given(
    session: Session,
) -> None:
    cid, _ = one_shard_checkpoint(session, f"node-{uuid.uuid4().hex[:8]}")
    held = lock_in_order(session, tier_copies=[(cid, "ssd")])
    failed = tier_copies.move(
        session, held, Move.PROMOTION_FAILED, [(cid, "ssd")], reason="1 of 1 shards missing"
    )
    assert failed == [(cid, "ssd")]
    assert _state(session, cid, "ssd") == ("failed", "1 of 1 shards missing")
    # Damage moves only restorable copies: this failed one stays as it is.
    assert tier_copies.move(session, held, Move.DAMAGED, [(cid, "ssd")], reason="rot") == []
    assert _state(session, cid, "ssd") == ("failed", "1 of 1 shards missing")
    assert tier_copies.move(session, held, Move.RETRIED, [(cid, "ssd")]) == [(cid, "ssd")]
    assert _state(session, cid, "ssd") == ("pending", "1 of 1 shards missing")
