"""The coded peer tier's encode (activities/encode.py), run on its node as the lifecycle would on
a real catalog and real files: each sealed file is cut into k+m stripes staged on its node,
each stripe placed pending on the holder placement names with the size and crc32c of the staged
bytes, and any k of them give the file back; a file changed after its seal stages nothing; a run
again reads nothing; a symlink planted in the staging area is never followed; reconciliation
knows the staging area and reports only what the catalog does not; expiring the coded copy
removes the stripes staged on the shards' node."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment
from tierpoint_client.erasure import Code
from tierpoint_client.erasure.files import StripeFile, decode_path

from activities.encode import EncodeActivities
from activities.lifecycle import LifecycleActivities
from activities.placement import stripe_holders
from activities.reconcile import ReconcileActivities
from activities.retention import RetentionActivities
from activities.stores import Stores
from tests.helpers.lifecycle import (
    ShardSpec,
    crc_hex,
    new_job,
    random_shards,
    seed_checkpoint,
    shard_file,
)
from tests.helpers.retention import create_job
from tierpoint.catalog.models import Shard, Stripe
from tierpoint.catalog.node.registry import upsert_node
from tierpoint.catalog.stripe import machine as stripe_machine
from tierpoint.config import Settings
from tierpoint.contract.integrity import ReconcileScanInput, ReconcileUnit
from tierpoint.contract.lifecycle import Batch, BatchResult, PlanInput, PromoteInput, SealInput
from tierpoint.contract.retention import DeleteInput, ExpiryInput
from tierpoint.contract.stripes import EncodeInput
from tierpoint.storage.paths import PARTIAL_SUFFIX
from tierpoint.storage.posix.staging import STAGING_DIR
from tierpoint.tier_config import TierConfig, TierKind

CODE = Code(2, 1)
NODES = ["node-a", "node-b", "node-c", "node-d"]


@pytest.fixture
def coded(catalog_settings: Settings, tmp_path: Path) -> Settings:
    ssd, *rest = catalog_settings.tiers
    tier = TierConfig(
        name="coded", kind=TierKind.PEER, root=str(tmp_path / "nodes/{node}/coded"), code=str(CODE)
    )
    for node in NODES:
        (tmp_path / "nodes" / node / "ssd").mkdir(parents=True, exist_ok=True)
    return Settings.model_validate({**catalog_settings.model_dump(), "tiers": [ssd, tier, *rest]})


def _sealed(
    settings: Settings, sessions: sessionmaker[Session], size: int
) -> tuple[int, str, list[ShardSpec]]:
    shards = random_shards(["node-a"], 3, size)
    seeded = seed_checkpoint(settings, sessions, new_job(), 5, shards)
    with sessions.begin() as s:
        for node in NODES:
            upsert_node(s, node, {})
    acts = LifecycleActivities(sessions, settings, Stores(settings), node="node-a")
    env = ActivityEnvironment()
    (batch,) = env.run(acts.plan, PlanInput(checkpoint_id=seeded.checkpoint_id)).batches
    seal = SealInput(
        checkpoint_id=seeded.checkpoint_id, job=seeded.job, step=5, batch=batch, tier="ssd"
    )
    assert env.run(acts.seal_batch, seal).verified == 3
    return seeded.checkpoint_id, seeded.job, shards


def _encode(settings: Settings, sessions: sessionmaker[Session], cp: int, job: str) -> BatchResult:
    acts = EncodeActivities(sessions, settings, Stores(settings), node="node-a")
    inp = EncodeInput(
        checkpoint_id=cp,
        job=job,
        step=5,
        batch=Batch(node="node-a", first=0, last=2),
        source="ssd",
        tier="coded",
    )
    return ActivityEnvironment().run(acts.encode_batch, inp)


def _staged(settings: Settings, job: str, index: int, path: str) -> Path:
    root = settings.tier("coded").root_for("node-a")
    return root / STAGING_DIR / str(index) / job / "5" / path


def test_a_sealed_file_is_cut_into_stripes_placed_on_their_holders(
    coded: Settings, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    # Three segments and a bit: stripes span segment boundaries.
    cp, job, shards = _sealed(coded, sessions, 3 * 4 * 1024 * 1024 + 12345)
    first = _encode(coded, sessions, cp, job)
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
        staged = _staged(coded, job, r.stripe_index, r.path).read_bytes()
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
        [StripeFile(i, _staged(coded, job, i, sh.path), recorded[i]) for i in (1, 2)],
        out,
    )
    assert out.read_bytes() == sh.data

    # Run again (a retry): nothing is read, nothing changes.
    again = _encode(coded, sessions, cp, job)
    assert (again.verified, again.skipped, again.bytes) == (3, 3, 0), again


def test_a_file_changed_after_its_seal_stages_no_stripe(
    coded: Settings, sessions: sessionmaker[Session]
) -> None:
    cp, job, shards = _sealed(coded, sessions, 100_000)
    changed = shards[0]
    f = shard_file(coded, "ssd", "node-a", job, 5, changed.path)
    flipped = bytearray(changed.data)
    flipped[77_777] ^= 0x01
    f.write_bytes(bytes(flipped))
    result = _encode(coded, sessions, cp, job)
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
        parent = _staged(coded, job, i, changed.path).parent
        assert not _staged(coded, job, i, changed.path).exists()
        # Not even a temp file is left behind.
        assert [n for n in os.listdir(parent) if changed.path.rsplit("/")[-1] in n] == []


def test_a_symlink_planted_in_the_staging_area_is_not_followed(
    coded: Settings, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    cp, job, _ = _sealed(coded, sessions, 1000)
    outside = tmp_path / "outside"
    outside.mkdir()
    link = _staged(coded, job, 0, "x").parent
    link.parent.mkdir(parents=True)
    link.symlink_to(outside)  # <staging>/0/<job>/5 -> outside
    with pytest.raises(Exception) as caught:
        _encode(coded, sessions, cp, job)
    assert isinstance(caught.value, ApplicationError) and caught.value.non_retryable
    assert list(outside.iterdir()) == []


def test_reconciliation_knows_the_staging_area_and_reports_only_what_the_catalog_does_not(
    coded: Settings, sessions: sessionmaker[Session]
) -> None:
    cp, job, shards = _sealed(coded, sessions, 5000)
    assert _encode(coded, sessions, cp, job).verified == 3
    acts = ReconcileActivities(sessions, coded, Stores(coded), node="node-a")
    env = ActivityEnvironment()
    unit = ReconcileUnit(tier="coded", kind=TierKind.PEER, node="node-a")
    scan = ReconcileScanInput(unit=unit, grace_seconds=3600)
    clean = env.run(acts.scan, scan)
    # The area and the 3 x 3 stripes staged in it are the catalog's: nothing is reported.
    assert clean.counts == {} and clean.scanned >= 9, clean

    staged = _staged(coded, job, 2, shards[0].path)
    stray = staged.parent / "notes.txt"
    stray.write_text("nobody registered this")
    temp = staged.parent / f".abandoned{PARTIAL_SUFFIX}"
    temp.write_bytes(b"half a stripe")
    old = time.time() - 7200
    os.utime(temp, (old, old))
    report = env.run(acts.scan, scan)
    assert report.counts == {"extra": 1, "abandoned_temp": 1}, report
    assert any("notes.txt" in e for e in report.examples["extra"])

    repaired = env.run(acts.scan, scan.model_copy(update={"repair": True}))
    assert repaired.cleaned == 1 and not temp.exists()
    # Never deleted: the stray file nobody registered, and the staged stripes.
    assert stray.exists() and staged.exists()


def test_expiring_a_coded_copy_removes_its_stripes_staged_on_the_shards_node(
    coded: Settings, sessions: sessionmaker[Session]
) -> None:
    cp, job, shards = _sealed(coded, sessions, 5000)
    assert _encode(coded, sessions, cp, job).verified == 3
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
    staged = [_staged(coded, job, i, sh.path) for sh in shards for i in range(CODE.width)]
    stray = staged[0].parent / "notes.txt"
    stray.write_text("nobody registered this")
    assert all(f.exists() for f in staged)

    on_a.delete_copy(DeleteInput(job=job, checkpoint_id=cp, step=5, tier="coded", node="node-a"))
    assert [f for f in staged if f.exists()] == []
    assert stray.exists()  # only what the encoder recorded is deleted
    # The job's own files on its local tier are not the coded copy's.
    assert all(shard_file(coded, "ssd", "node-a", job, 5, sh.path).exists() for sh in shards)
