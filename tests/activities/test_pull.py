"""The holders' pull of a coded tier's stripes (activities/pull.py), each on its holder's worker,
from the shards' node's real data endpoint over HTTP, on a real catalog and real files: every
stripe lands under its holder's root with the encoder's bytes, is verified by its read-back from
the holder's device, and the coded copy is promoted; any k of the held stripes give the file
back; a stripe rotten at rest in the staging area is read again, never verified, and the copy is
not promoted; a pull run again reads nothing; the staging area gives up the stripes of every set
verified whole, and only those; reconciliation on a holder knows the stripes it holds, reports
one missing or of the wrong size and with repair records it lost or corrupt; an expiry of the
coded copy visits every holder and deletes the stripes it holds, and only those."""

from __future__ import annotations

import asyncio
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker
from temporalio.testing import ActivityEnvironment
from tierpoint_client.erasure.files import StripeFile, decode_path

from activities.encode import EncodeActivities
from activities.lifecycle import LifecycleActivities
from activities.retention import RetentionActivities
from activities.stores import Stores
from tests.helpers.coded_tier import (
    CODE,
    STEP,
    coded,
    holders_a,
    pull,
    ready,
    server,
    staged_file,
    stripe_states,
)
from tests.helpers.lifecycle import crc_hex
from tests.helpers.retention import create_job
from tierpoint.config import Settings
from tierpoint.contract.lifecycle import Batch, BatchResult, PromoteInput
from tierpoint.contract.retention import DeleteInput, ExpiryInput, RetentionPlanInput
from tierpoint.contract.stripes import EncodeInput
from tierpoint.services.data_endpoint import DataServer

# Imported fixtures: the coded tier and node-a's data endpoint.
__all__ = ["coded", "server"]


def _unstage(settings: Settings, sessions: sessionmaker[Session], cp: int, job: str) -> BatchResult:
    acts = EncodeActivities(sessions, settings, Stores(settings), node="node-a")
    batch = Batch(node="node-a", first=0, last=2)
    inp = EncodeInput(checkpoint_id=cp, job=job, step=STEP, batch=batch, source="ssd", tier="coded")
    return ActivityEnvironment().run(acts.unstage_batch, inp)


def _promote(settings: Settings, sessions: sessionmaker[Session], cp: int) -> str:
    acts = LifecycleActivities(sessions, settings, Stores(settings))
    out = ActivityEnvironment().run(acts.promote, PromoteInput(checkpoint_id=cp, tier="coded"))
    return str(out.state)


def test_holders_pull_their_stripes_and_the_coded_copy_is_promoted(
    coded: Settings, sessions: sessionmaker[Session], server: DataServer, tmp_path: Path
) -> None:
    cp, job, shards = ready(coded, sessions, server, 5 * 1024 * 1024 + 7)
    holders = holders_a()
    for holder in holders:
        got = pull(coded, sessions, cp, job, holder)
        assert (got.shards, got.verified, got.corrupt) == (3, 3, 0), got
    assert set(stripe_states(sessions, cp).values()) == {"verified"}
    for sh in shards:
        for i, holder in enumerate(holders):
            held = coded.tier("coded").root_for(holder) / job / str(STEP) / sh.path
            assert held.read_bytes() == staged_file(coded, job, i, sh.path).read_bytes()
    assert _promote(coded, sessions, cp) == "restorable"

    # Any k held stripes give the file back: parity and the second data stripe.
    sh = shards[2]
    files = [
        StripeFile(
            i,
            coded.tier("coded").root_for(holders[i]) / job / str(STEP) / sh.path,
            crc_hex(staged_file(coded, job, i, sh.path).read_bytes()),
        )
        for i in (2, 1)
    ]
    out = tmp_path / "decoded"
    decode_path(CODE, len(sh.data), crc_hex(sh.data), files, out)
    assert out.read_bytes() == sh.data

    again = pull(coded, sessions, cp, job, holders[0])
    assert (again.verified, again.skipped, again.bytes) == (3, 3, 0), again

    # Every set verified on its holders: the staging area gives its stripes up.
    stray = staged_file(coded, job, 0, "notes.txt")
    stray.write_text("nobody registered this")
    assert _unstage(coded, sessions, cp, job).verified == 3
    staged = [staged_file(coded, job, i, s.path) for s in shards for i in range(CODE.width)]
    assert [f for f in staged if f.exists()] == [] and stray.exists()


def test_a_stripe_rotten_in_the_staging_area_is_never_verified(
    coded: Settings, sessions: sessionmaker[Session], server: DataServer
) -> None:
    cp, job, shards = ready(coded, sessions, server, 200_000)
    holders = holders_a()
    rotten = staged_file(coded, job, 1, shards[0].path)
    data = bytearray(rotten.read_bytes())
    data[len(data) // 2] ^= 0x40
    rotten.write_bytes(bytes(data))
    got = pull(coded, sessions, cp, job, holders[1])
    assert (got.verified, got.corrupt) == (2, 1), got
    assert shards[0].path in got.problems[0]
    for holder in (holders[0], holders[2]):
        assert pull(coded, sessions, cp, job, holder).verified == 3
    states = stripe_states(sessions, cp)
    assert states[(shards[0].path, 1)] == "corrupt"
    assert [k for k, v in states.items() if v != "verified"] == [(shards[0].path, 1)]
    # The set is not whole: the coded copy is not promoted, and its staged stripes stay for
    # another pull; the whole sets' go.
    assert _promote(coded, sessions, cp) == "failed"
    assert _unstage(coded, sessions, cp, job).verified == 2
    for sh in shards:
        kept = [staged_file(coded, job, i, sh.path).exists() for i in range(CODE.width)]
        assert kept == [sh is shards[0]] * CODE.width, sh.path


def test_expiring_a_coded_copy_deletes_its_stripes_on_every_holder(
    coded: Settings, sessions: sessionmaker[Session], server: DataServer
) -> None:
    cp, job, shards = ready(coded, sessions, server, 40_000)
    holders = holders_a()
    for holder in holders:
        assert pull(coded, sessions, cp, job, holder).verified == 3
    assert _promote(coded, sessions, cp) == "restorable"
    lifecycle = LifecycleActivities(sessions, coded, Stores(coded))
    for tier, error in (("ssd", None), ("lustre", "not in this test"), ("s3", "nor this")):
        ActivityEnvironment().run(
            lifecycle.promote, PromoteInput(checkpoint_id=cp, tier=tier, stage_error=error)
        )
    create_job(sessions, job, {"tiers": {"coded": {"keep_last": 0}}})
    stores = Stores(coded)
    shared = RetentionActivities(sessions, coded, stores)
    (task,) = shared.plan(RetentionPlanInput(job=job)).tasks
    # The shards' node (its staging area) and every holder.
    assert (task.tier, sorted(task.nodes)) == ("coded", sorted(["node-a", *holders]))
    assert shared.begin_expiry(ExpiryInput(job=job, checkpoint_id=cp, tier="coded")).state == (
        "expiring"
    )
    held = [
        coded.tier("coded").root_for(h) / job / str(STEP) / sh.path
        for h in holders
        for sh in shards
    ]
    stray = held[0].parent / "notes.txt"
    stray.write_text("nobody registered this")
    for node in task.nodes:
        on = RetentionActivities(sessions, coded, stores, node=node)
        on.delete_copy(DeleteInput(job=job, checkpoint_id=cp, step=STEP, tier="coded", node=node))
    assert [f for f in held if f.exists()] == [] and stray.exists()
    finished = asyncio.run(
        shared.finish_expiry(ExpiryInput(job=job, checkpoint_id=cp, tier="coded"))
    )
    assert finished.state == "expired"
    assert set(stripe_states(sessions, cp).values()) == {"expired"}


def test_a_stripe_gone_from_the_staging_area_is_reported_and_the_others_pulled(
    coded: Settings, sessions: sessionmaker[Session], server: DataServer
) -> None:
    cp, job, shards = ready(coded, sessions, server, 30_000)
    holder = holders_a()[2]
    staged_file(coded, job, 2, shards[1].path).unlink()
    got = pull(coded, sessions, cp, job, holder)
    # Reported at once, not retried: no pull brings a stripe back to the staging area.
    assert (got.verified, got.corrupt) == (2, 1), got
    assert shards[1].path in got.problems[0]
    assert stripe_states(sessions, cp)[(shards[1].path, 2)] == "pending"
