"""`Reconcile` (workflows/reconcile.py) on the real stack: one scan per node's own root of a
node-local tier, each on that node's queue, their reports in one order whichever finished
first, and no repair asked for when the run only reports.

Real services (Temporal dev server, Postgres); the nodes' workers and the shared worker in the
test process."""

from __future__ import annotations

from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client

from tests.helpers.catalog_rows import verified_everywhere
from tests.helpers.integrity import run_reconcile
from tests.helpers.lifecycle import new_job, running_workers, shard_file
from tierpoint.config import Settings
from tierpoint.contract.integrity import ReconcileInput


async def test_each_node_scans_its_own_root_and_the_report_is_in_one_order(
    settings: Settings, sessions: sessionmaker[Session], client: Client
) -> None:
    job = new_job()
    seeded = verified_everywhere(settings, sessions, job, 2)
    gone = next(sh for sh in seeded.shards if sh.node == "node-b")
    shard_file(settings, "ssd", "node-b", job, 2, gone.path).unlink()

    async with running_workers(settings, client):
        report = await run_reconcile(
            client, f"reconcile-test/{job}", ReconcileInput(tier="ssd", job=job)
        )
    assert (report.tier, report.job, report.repair) == ("ssd", job, False)
    assert [(t.tier, t.node) for t in report.tiers] == [("ssd", "node-a"), ("ssd", "node-b")]
    node_a, node_b = report.tiers
    assert (node_a.checked, node_a.counts, node_a.error) == (2, {}, None)
    assert (node_b.checked, node_b.counts) == (2, {"missing": 1})
    assert node_b.examples["missing"] == [f"{job}/2/{gone.path}"]
    assert report.repairs_requested == 0
