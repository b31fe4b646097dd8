"""The coded peer tier's encode (activities/encode.py), run on its node as the lifecycle would on
a real catalog and real files: each sealed file is cut into k+m stripes staged on its node,
each stripe placed pending on the holder placement names with the size and crc32c of the staged
bytes, and any k of them give the file back; a file changed after its seal stages nothing; a run
again reads nothing; a symlink planted in the staging area is never followed; reconciliation
knows the staging area and reports only what the catalog does not; expiring the coded copy
removes the stripes staged on the shards' node."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment
from tierpoint_client.erasure.files import StripeFile, decode_path

from activities.lifecycle import LifecycleActivities
from activities.placement import stripe_holders
from activities.retention import RetentionActivities
from activities.stores import Stores
from tests.helpers.coded_tier import CODE, NODES, coded_settings, encode, sealed, staged_file
from tests.helpers.lifecycle import (
    crc_hex,
    shard_file,
)
from tests.helpers.retention import create_job
from tierpoint.catalog.models import Shard, Stripe
from tierpoint.catalog.stripe import machine as stripe_machine
from tierpoint.config import Settings
from tierpoint.contract.lifecycle import PromoteInput
from tierpoint.contract.retention import DeleteInput, ExpiryInput


@pytest.fixture
def coded(catalog_settings: Settings, tmp_path: Path) -> Settings:
    return coded_settings(catalog_settings, tmp_path)


def test_a_sealed_file_is_cut_into_stripes_placed_on_their_holders(
    coded: Settings, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    # Three segments and a bit: stripes span segment boundaries.
    cp, job, shards = sealed(coded, sessions, 3 * 4 * 1024 * 1024 + 12345)
    first = encode(coded, sessions, cp, job)
    assert (first.verified, first.skipped, first.corrupt) == (3, 0, 0), first
    holders = stripe_holders("node-a", NODES, CODE)
    assert holders is not None and "node-a" not in holders
    with sessions() as s:
        rows = s.execute(
            select(Shard.path, Stripe.stripe_index, Stripe.node_id, Stripe.size, Stripe.crc32c)
            .join(Shard, Shard.id == Stripe.shard_id)
            .add_columns(Stripe.state, Stripe.code)
            .where(Stripe.checkpoint_id == cp, Stripe.tier == "coded")
        ).all()
    assert len(rows) == 3 * CODE.width
    for r in rows:
        staged = staged_file(coded, job, r.stripe_index, r.path).read_bytes()
        # What the catalog records is what lies in the staging area.
        assert (r.size, r.crc32c) == (len(staged), crc_hex(staged))
        assert (r.node_id, r.state, r.code) == (holders[r.stripe_index], "pending", "rs(2,1)")
    # Any k of the staged stripes give the file back: here the parity and one data stripe.
    sh = shards[1]
    recorded = {r.stripe_index: r.crc32c for r in rows if r.path == sh.path}
    out = tmp_path / "decoded"
    decode_path(
        CODE,
        len(sh.data),
        crc_hex(sh.data),
        [StripeFile(i, staged_file(coded, job, i, sh.path), recorded[i]) for i in (1, 2)],
        out,
    )
    assert out.read_bytes() == sh.data

    # Run again (a retry): nothing is read, nothing changes.
    again = encode(coded, sessions, cp, job)
    assert (again.verified, again.skipped, again.bytes) == (3, 3, 0), again


def test_a_file_changed_after_its_seal_stages_no_stripe(
    coded: Settings, sessions: sessionmaker[Session]
) -> None:
    cp, job, shards = sealed(coded, sessions, 100_000)
    changed = shards[0]
    f = shard_file(coded, "ssd", "node-a", job, 5, changed.path)
    flipped = bytearray(changed.data)
    flipped[77_777] ^= 0x01
    f.write_bytes(bytes(flipped))
    result = encode(coded, sessions, cp, job)
    assert (result.verified, result.corrupt) == (2, 1), result
    assert changed.path in result.problems[0]
    with sessions() as s:
        placed = s.scalars(
            select(Shard.path)
            .join(Stripe, Stripe.shard_id == Shard.id)
            .where(Stripe.checkpoint_id == cp)
            .distinct()
        ).all()
    assert changed.path not in placed
    for i in range(CODE.width):
        parent = staged_file(coded, job, i, changed.path).parent
        assert not staged_file(coded, job, i, changed.path).exists()
        # Not even a temp file is left behind.
        assert [n for n in os.listdir(parent) if changed.path.rsplit("/")[-1] in n] == []


def test_a_symlink_planted_in_the_staging_area_is_not_followed(
    coded: Settings, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    cp, job, _ = sealed(coded, sessions, 1000)
    outside = tmp_path / "outside"
    outside.mkdir()
    link = staged_file(coded, job, 0, "x").parent
    link.parent.mkdir(parents=True)
    link.symlink_to(outside)  # <staging>/0/<job>/5 -> outside
    with pytest.raises(Exception) as caught:
        encode(coded, sessions, cp, job)
    assert isinstance(caught.value, ApplicationError) and caught.value.non_retryable
    assert list(outside.iterdir()) == []


def test_expiring_a_coded_copy_removes_its_stripes_staged_on_the_shards_node(
    coded: Settings, sessions: sessionmaker[Session]
) -> None:
    cp, job, shards = sealed(coded, sessions, 5000)
    assert encode(coded, sessions, cp, job).verified == 3
    create_job(sessions, job, {"tiers": {"coded": {"keep_last": 0}}})
    # What the holders' read-back records once they pulled their stripes (the copy's next step).
    with sessions.begin() as s:
        rows = s.execute(
            select(Stripe.shard_id, Stripe.stripe_index, Stripe.size, Stripe.crc32c).where(
                Stripe.checkpoint_id == cp
            )
        ).all()
        stripe_machine.read_back(s, "coded", [stripe_machine.ReadBack(*r) for r in rows])
    lifecycle = LifecycleActivities(sessions, coded, Stores(coded))
    promoted = ActivityEnvironment().run(
        lifecycle.promote, PromoteInput(checkpoint_id=cp, tier="coded")
    )
    assert promoted.state == "restorable", promoted
    # The checkpoint's other copies settled: its local copy restorable, the rest given up.
    for tier, error in (("ssd", None), ("lustre", "not in this test"), ("s3", "nor this")):
        ActivityEnvironment().run(
            lifecycle.promote, PromoteInput(checkpoint_id=cp, tier=tier, stage_error=error)
        )
    stores = Stores(coded)
    shared = RetentionActivities(sessions, coded, stores)
    on_a = RetentionActivities(sessions, coded, stores, node="node-a")
    begun = shared.begin_expiry(ExpiryInput(job=job, checkpoint_id=cp, tier="coded"))
    assert begun.state == "expiring", begun
    staged = [staged_file(coded, job, i, sh.path) for sh in shards for i in range(CODE.width)]
    stray = staged[0].parent / "notes.txt"
    stray.write_text("nobody registered this")
    assert all(f.exists() for f in staged)

    on_a.delete_copy(DeleteInput(job=job, checkpoint_id=cp, step=5, tier="coded", node="node-a"))
    assert [f for f in staged if f.exists()] == []
    assert stray.exists()  # only what the encoder recorded is deleted
    # The job's own files on its local tier are not the coded copy's.
    assert all(shard_file(coded, "ssd", "node-a", job, 5, sh.path).exists() for sh in shards)
