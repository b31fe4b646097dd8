"""Reconciliation of a coded tier on a node (activities/reconcile_staging.py), run on the node's
worker on a real catalog and real files: its staging area is known and only what the catalog
does not know there is reported (an abandoned temp file removed with repair, a stray file never);
on a holder, the stripes it holds are known, one missing or of the wrong size is reported and
with repair recorded lost or corrupt (and the coded copy's rebuild asked for, which cuts it again),
a stray file is reported and kept."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import WorkflowExecutionStatus
from temporalio.testing import ActivityEnvironment

from activities.reconcile import ReconcileActivities
from activities.stores import Stores
from tests.helpers.coded_tier import (
    CODE,
    STEP,
    coded,
    encode,
    holders_a,
    pull,
    ready,
    sealed,
    server,
    staged_file,
    stripe_states,
)
from tests.helpers.services import Services
from tierpoint.catalog.models import TierCopy
from tierpoint.catalog.tier_copy.promotion import promote
from tierpoint.config import Settings
from tierpoint.contract.integrity import ReconcileScanInput, ReconcileUnit
from tierpoint.contract.peer import rereplicate_id
from tierpoint.services.data_endpoint import DataServer
from tierpoint.services.stripe_rebuild import RebuildRequests
from tierpoint.storage.paths import PARTIAL_SUFFIX
from tierpoint.temporal import connect
from tierpoint.tier_config import TierKind

# Imported fixtures: the coded tier and node-a's data endpoint.
__all__ = ["coded", "server"]


def test_reconciliation_knows_the_staging_area_and_reports_only_what_the_catalog_does_not(
    coded: Settings, sessions: sessionmaker[Session]
) -> None:
    cp, job, shards = sealed(coded, sessions, 5000)
    assert encode(coded, sessions, cp, job).verified == 3
    acts = ReconcileActivities(sessions, coded, Stores(coded), node="node-a")
    env = ActivityEnvironment()
    unit = ReconcileUnit(tier="coded", kind=TierKind.PEER, node="node-a")
    scan = ReconcileScanInput(unit=unit, grace_seconds=3600)
    clean = env.run(acts.scan, scan)
    # The area and the 3 x 3 stripes staged in it are the catalog's: nothing is reported.
    assert clean.counts == {} and clean.scanned >= 9, clean

    staged = staged_file(coded, job, 2, shards[0].path)
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


def test_reconciliation_on_a_holder_knows_its_stripes_and_marks_the_damaged(
    coded: Settings, sessions: sessionmaker[Session], server: DataServer
) -> None:
    cp, job, shards = ready(coded, sessions, server, 50_000)
    holder = holders_a()[0]
    assert pull(coded, sessions, cp, job, holder).verified == 3
    acts = ReconcileActivities(sessions, coded, Stores(coded), node=holder)
    env = ActivityEnvironment()
    unit = ReconcileUnit(tier="coded", kind=TierKind.PEER, node=holder)
    scan = ReconcileScanInput(unit=unit, job=job, grace_seconds=3600)
    clean = env.run(acts.scan, scan)
    assert (clean.counts, clean.checked) == ({}, 3), clean

    root = coded.tier("coded").root_for(holder) / job / str(STEP)
    (root / shards[0].path).unlink()
    (root / shards[1].path).write_bytes(b"short")
    stray = root / "notes.txt"
    stray.write_text("nobody registered this")
    report = env.run(acts.scan, scan)
    assert report.counts == {"missing": 1, "wrong_size": 1, "extra": 1}, report
    assert set(stripe_states(sessions, cp).values()) == {"verified", "pending"}

    repaired = env.run(acts.scan, scan.model_copy(update={"repair": True}))
    assert repaired.marked == 2 and stray.exists()
    states = stripe_states(sessions, cp)
    assert (states[(shards[0].path, 0)], states[(shards[1].path, 0)]) == ("lost", "corrupt")
    assert states[(shards[2].path, 0)] == "verified"


async def test_reconciliation_that_leaves_a_set_below_k_fails_the_restorable_coded_copy(
    coded: Settings,
    sessions: sessionmaker[Session],
    server: DataServer,
    services: Services,
    temporal_namespace: str,
) -> None:
    cp, job, shards = ready(coded, sessions, server, 50_000)
    holders = holders_a()
    for holder in holders:
        assert pull(coded, sessions, cp, job, holder).verified == 3
    with sessions.begin() as s:
        assert promote(s, cp, "coded", [], None, CODE).state == "restorable"
    env = ActivityEnvironment()
    # The node worker's: asks on this loop with a real Temporal client, from the scan's thread.
    on = {"temporal_address": services.temporal_address, "temporal_namespace": temporal_namespace}
    client = await connect(coded.model_copy(update=on))
    rebuilds = RebuildRequests(client, asyncio.get_running_loop())

    async def reconcile(holder: str) -> int:
        acts = ReconcileActivities(sessions, coded, Stores(coded), node=holder, rebuilds=rebuilds)
        unit = ReconcileUnit(tier="coded", kind=TierKind.PEER, node=holder)
        scan = ReconcileScanInput(unit=unit, job=job, grace_seconds=3600, repair=True)
        return (await asyncio.to_thread(env.run, acts.scan, scan)).marked

    def held(i: int) -> Path:
        return coded.tier("coded").root_for(holders[i]) / job / str(STEP) / shards[0].path

    # One stripe of the first set gone: it keeps k = 2, the copy stays what a restore reads, and
    # its rebuild is asked for (no worker runs it here: it is told it was not needed).
    held(0).unlink()
    assert await reconcile(holders[0]) == 1
    assert _coded_state(sessions, cp) == ("restorable", None)
    rebuild = client.get_workflow_handle(rereplicate_id(job, STEP))
    assert (await rebuild.describe()).status is WorkflowExecutionStatus.RUNNING
    await rebuild.terminate("the test's: no worker runs it")
    # Run again (as a retry after an ask that failed): nothing new found, the rebuild asked again.
    assert await reconcile(holders[0]) == 0
    assert (await rebuild.describe()).status is WorkflowExecutionStatus.RUNNING
    await rebuild.terminate("the test's: no worker runs it")
    # A second: below k, the copy fails and says which stripe.
    held(1).unlink()
    assert await reconcile(holders[1]) == 1
    state, reason = _coded_state(sessions, cp)
    assert state == "failed" and f"{shards[0].path} stripe 1" in (reason or ""), reason


def _coded_state(sessions: sessionmaker[Session], cp: int) -> tuple[str, str | None]:
    with sessions() as s:
        row = s.execute(
            select(TierCopy.state, TierCopy.reason).where(
                TierCopy.checkpoint_id == cp, TierCopy.tier == "coded"
            )
        ).one()
    return row.state, row.reason
