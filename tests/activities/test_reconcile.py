"""Reconciliation's activities (activities/reconcile.py) run one by one on a real catalog and
real files: a node's scan compares its local tier with the catalog and reports what is missing,
of the wrong size, extra or an abandoned temp file; only with repair does it mark the replicas
(lost, corrupt: their copy demoted for repair) and remove the temp file, and it never deletes an
extra file."""

from __future__ import annotations

import os
import time

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from temporalio.testing import ActivityEnvironment

from activities.reconcile import ReconcileActivities
from activities.stores import Stores
from tests.helpers.catalog_rows import tier_copy_states, verified_everywhere
from tests.helpers.lifecycle import new_job, shard_file
from tierpoint.catalog.models import Replica, Shard
from tierpoint.config import Settings
from tierpoint.contract.integrity import ReconcileInput, ReconcileScanInput, ReconcileUnit
from tierpoint.storage.paths import PARTIAL_SUFFIX
from tierpoint.tier_config import TierKind


def test_a_nodes_scan_reports_and_with_repair_marks_and_cleans(
    settings: Settings, sessions: sessionmaker[Session]
) -> None:
    job = new_job()
    seeded = verified_everywhere(settings, sessions, job, 3)
    acts = ReconcileActivities(sessions, settings, Stores(settings), node="node-a")
    env = ActivityEnvironment()
    plan = env.run(acts.plan, ReconcileInput(tier="ssd"))
    assert {(u.tier, u.node) for u in plan.units} >= {("ssd", "node-a"), ("ssd", "node-b")}

    gone, short = (sh for sh in seeded.shards if sh.node == "node-a")
    shard_file(settings, "ssd", "node-a", job, 3, gone.path).unlink()
    shard_file(settings, "ssd", "node-a", job, 3, short.path).write_bytes(b"short")
    step_dir = shard_file(settings, "ssd", "node-a", job, 3, short.path).parent
    extra = step_dir / "notes.txt"
    extra.write_text("the job's own file")
    temp = step_dir / f".copy{PARTIAL_SUFFIX}"
    temp.write_bytes(b"half a copy")
    old = time.time() - 7200
    os.utime(temp, (old, old))

    unit = ReconcileUnit(tier="ssd", kind=TierKind.LOCAL, node="node-a")
    scan = ReconcileScanInput(unit=unit, job=job, grace_seconds=3600)
    report = env.run(acts.scan, scan)
    assert report.counts == {"missing": 1, "wrong_size": 1, "extra": 1, "abandoned_temp": 1}
    assert (report.marked, report.cleaned) == (0, 0) and temp.exists()
    assert tier_copy_states(sessions, seeded.checkpoint_id)["ssd"] == "restorable"

    repaired = env.run(acts.scan, scan.model_copy(update={"repair": True}))
    assert (repaired.marked, repaired.cleaned) == (2, 1)
    assert repaired.damaged == [seeded.checkpoint_id]
    assert not temp.exists() and extra.exists()
    with sessions() as s:
        states = dict(
            s.execute(
                select(Shard.path, Replica.state)
                .join(Replica, Replica.shard_id == Shard.id)
                .where(Shard.checkpoint_id == seeded.checkpoint_id, Replica.tier == "ssd")
            ).all()
        )
    assert (states[gone.path], states[short.path]) == ("lost", "corrupt")
    assert tier_copy_states(sessions, seeded.checkpoint_id)["ssd"] == "failed"
