"""A coded peer tier (rs(4,2) over eleven nodes) rebuilt after lost nodes, on the real stack: the
node workers with their data endpoints, the project's shared worker, a real Temporal server, the
catalog with its migrations, the API's declaration of a lost node (the catalog's move, then the
re-replication started or signalled).

A rank's node is lost: the coded copy stays restorable and the rank's files are restored on a
spare from stripes, byte for byte. The rebuild re-places the stripes the node held on the next
node of their set's ring holding none of the set, whose worker is stopped: the rebuild waits on
its queue. That new holder is declared lost during the rebuild: the restore still gives every
byte, and the rebuild places its stripes again elsewhere, with the stripes the new holder held
itself. Then every set is whole (k+m verified, on k+m distinct live nodes, none the shard's own).
Three holders of one set lost with no node worker serving: the set is below k, the coded copy is
failed and not offered, the shared tier serves the restore, and that set is not rebuilt."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client
from tierpoint_client.erasure import Code

from tests.helpers.coded_tier import (
    SECRET,
    StripeRow,
    coded_settings,
    declare_lost,
    restore_on_spare,
    spare_plan,
    stripe_rows,
)
from tests.helpers.faults import db_now, eventually, workers_reported_in
from tests.helpers.lifecycle import (
    markers,
    new_job,
    random_shards,
    run_lifecycle,
    running_workers,
    seed_checkpoint,
)
from tierpoint.config import Settings
from tierpoint.contract.peer import rereplicate_id

CODE = Code(4, 2)
NODES = tuple(f"node-{i:02d}" for i in range(11))
RANKS = NODES[:4]
RESULT_TIMEOUT = 120.0


@pytest.fixture
def settings(settings: Settings, tmp_path: Path) -> Settings:
    return coded_settings(
        settings, tmp_path, code=CODE, nodes=NODES, below=("lustre",), data_token=SECRET
    )


class Stripes:
    """The coded copy's stripe rows as the catalog has them."""

    def __init__(self, sessions: sessionmaker[Session], checkpoint_id: int) -> None:
        self._sessions, self._cp = sessions, checkpoint_id

    def rows(self) -> list[StripeRow]:
        return stripe_rows(self._sessions, self._cp)

    def holders(self, rank: str) -> set[str]:
        return {r.holder for r in self.rows() if r.shard_node == rank}

    def whole(self) -> bool:
        """Every set: k+m verified stripes on k+m distinct live nodes, none the shard's own."""
        sets: dict[str, list[StripeRow]] = {}
        for r in self.rows():
            sets.setdefault(r.path, []).append(r)
        return all(
            len(members) == CODE.width
            and all(r.state == "verified" and not r.holder_lost for r in members)
            and len({r.holder for r in members}) == CODE.width
            and all(r.holder != r.shard_node for r in members)
            for members in sets.values()
        )


async def test_lost_holders_stripes_are_rebuilt_through_a_second_loss_and_m_plus_one_is_not(
    settings: Settings,
    sessions: sessionmaker[Session],
    client: Client,
    engine: Engine,
    tmp_path: Path,
) -> None:
    job = new_job()
    shards = random_shards(RANKS, 2, 300_000)
    every_file = {sh.path: sh.data for sh in shards}
    seeded = seed_checkpoint(settings, sessions, job, 1, shards)
    stripes = Stripes(sessions, seeded.checkpoint_id)
    lost, held_back = "node-01", "node-07"
    since = db_now(engine)

    async def declare(node: str) -> None:
        """As the API's declaration does: the catalog's move committed, then the rebuild."""
        await declare_lost(settings, node, client)

    async def rebuilt() -> None:
        handle = client.get_workflow_handle(rereplicate_id(job, 1))
        await asyncio.wait_for(handle.result(), RESULT_TIMEOUT)

    def restore(dest: str) -> tuple[set[str], dict[str, bytes]]:
        plan = spare_plan(settings, sessions, job)
        return {e.tier for e in plan}, restore_on_spare(plan, tmp_path / dest)

    async with contextlib.AsyncExitStack() as shared:
        # Each group of node workers is stopped on its own below, and with the rest on any failure.
        nodes = await shared.enter_async_context(contextlib.AsyncExitStack())
        others = [n for n in NODES if n != held_back]
        await nodes.enter_async_context(
            running_workers(settings, client, nodes=others, shared=False)
        )
        spare = await shared.enter_async_context(contextlib.AsyncExitStack())
        await spare.enter_async_context(
            running_workers(settings, client, nodes=[held_back], shared=False)
        )
        await workers_reported_in(engine, NODES, since)
        # The shared worker refuses a code the nodes it knows cannot hold: it starts after them.
        await shared.enter_async_context(running_workers(settings, client, nodes=(), shared=True))
        result, _ = await run_lifecycle(client, seeded)
        assert {t.tier: t.state.value for t in result.tiers}["coded"] == "restorable"
        assert stripes.whole()
        # node-01 holds a stripe of node-00's set, and node-07 is the next node of node-00's
        # ring that holds none of it: the rebuild's new holder.
        assert lost in stripes.holders("node-00") and held_back not in stripes.holders("node-00")

        # node-07's worker stops: the rebuild's batch waits on its queue (it reported in lately,
        # so the plan counts it as serving).
        await spare.aclose()
        await declare(lost)
        assert markers(sessions, seeded.checkpoint_id)["coded"][0] == "restorable"

        async def re_placed() -> bool:
            rows = await asyncio.to_thread(stripes.rows)
            moved = [r for r in rows if r.shard_node == "node-00" and r.holder == held_back]
            return len(moved) == 2 and {r.state for r in moved} == {"pending"}

        await eventually("node-01's stripes of node-00's set re-placed on node-07", re_placed)
        # The lost rank's files (and every other) restored on a spare from the stripes.
        tiers, got = await asyncio.to_thread(restore, "spare-1")
        assert tiers == {"coded"} and got == every_file

        # The new holder is lost during the rebuild: its stripes are placed again.
        await declare(held_back)
        tiers, got = await asyncio.to_thread(restore, "spare-2")
        assert tiers == {"coded"} and got == every_file
        await rebuilt()
        assert stripes.whole(), stripes.rows()
        assert not {lost, held_back} & {r.holder for r in stripes.rows()}
        assert markers(sessions, seeded.checkpoint_id)["coded"][0] == "restorable"
        tiers, got = await asyncio.to_thread(restore, "spare-3")
        assert tiers == {"coded"} and got == every_file

        # No node worker serves: three holders of node-02's set lost before any rebuild can run.
        await nodes.aclose()
        # node-03 and the last two: every other set keeps k (the others hold at most two of them).
        doomed = ["node-03", *sorted(stripes.holders("node-02"))[-2:]]
        assert "node-03" in stripes.holders("node-02")
        for node in doomed:
            await declare(node)
        state, reason = markers(sessions, seeded.checkpoint_id)["coded"]
        assert state == "failed", (state, reason)
        tiers, got = await asyncio.to_thread(restore, "spare-4")
        assert tiers == {"lustre"} and got == every_file

        left = [n for n in NODES if n not in {lost, held_back, *doomed}]
        async with running_workers(settings, client, nodes=left, shared=False):
            await rebuilt()
        assert markers(sessions, seeded.checkpoint_id)["coded"][0] == "failed"
        verified = [
            r
            for r in stripes.rows()
            if r.shard_node == "node-02" and r.state == "verified" and not r.holder_lost
        ]
        assert len(verified) == 2 * (CODE.width - len(doomed))
        tiers, _ = await asyncio.to_thread(restore, "spare-5")
        assert tiers == {"lustre"}
