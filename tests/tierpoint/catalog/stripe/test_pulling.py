"""What a holder reads of the stripe table (catalog/stripe/pulling.py), on a real catalog: the
stripes placed on it of a batch's shards, the ones it holds for reconciliation, and what an
expiry may delete there; nothing of another holder's, nothing expired."""

from __future__ import annotations

from sqlalchemy.orm import Session

from tests.helpers.stripe_rows import CODE, TIER, checkpoint, names, placed
from tierpoint.catalog.stripe import machine as stripes
from tierpoint.catalog.stripe.pulling import Held, ToPull, held_copies, held_stripes, to_pull
from tierpoint.storage.base import RecordedCopy


def test_a_holder_reads_only_its_own_stripes(session: Session) -> None:
    cp, (first, second), holders = checkpoint(session, 2)
    job, source = names(session, cp)
    stripes.place(session, cp, TIER, str(CODE), placed(first, holders))
    holder = holders[2]

    got = to_pull(session, cp, TIER, source, holder, (0, 1))
    assert got is not None and (got.job, got.step, got.branch) == (job, 1, 1)
    assert got.stripes == [ToPull(first, 2, "f0", 102, "00000002", "pending")]
    # Ordinal 1 (the second shard) is placed nowhere; the source holds none of its own.
    assert to_pull(session, cp, TIER, source, holder, (1, 1)).stripes == []  # type: ignore[union-attr]
    assert to_pull(session, cp, TIER, source, source, (0, 1)).stripes == []  # type: ignore[union-attr]
    assert to_pull(session, -1, TIER, source, holder, (0, 1)) is None

    assert held_stripes(session, holder, TIER, job) == {("1", "f0"): Held(first, 2, 102, "pending")}
    assert held_copies(session, cp, TIER, holder) == [RecordedCopy("f0", 102, "00000002")]
    assert second not in {h.shard_id for h in held_stripes(session, holder, TIER, job).values()}

    stripes.expire(session, stripes.Move.EXPIRED, [(cp, TIER)])
    assert held_stripes(session, holder, TIER, job) == {}
    assert to_pull(session, cp, TIER, source, holder, (0, 1)).stripes == []  # type: ignore[union-attr]
