"""A coded peer tier's new holder killed (SIGKILL) while its rebuild batch transfers, on real
services: the new holder a real `tierpoint worker` process with its data endpoint, the other node
workers and the project's shared worker in the test process, a real Temporal server, the catalog
with its migrations.

rs(2,1) over six nodes a..f: node a's file is cut into stripes held by b, c and d. b is declared
lost, and the rebuild re-places its stripe on e (the next node of a's ring holding none of the
set), whose worker process reads the other two off c's and d's endpoints (slowed, so the batch is
caught mid-way) and is killed once part of a stripe is seen in its scratch area. Then either
- e's worker is started again: the batch is retried on e's queue once its heartbeat times out,
  and the stripe ends verified on e; or
- e is declared lost: the running rebuild is told, plans again, and cuts the stripe on f.
Either way every set is whole on live nodes, every file is restored from stripes byte for byte
(one decode from the rebuilt stripe itself), no holder's directory keeps a file the catalog does
not name (no temp file of the killed attempt), every stripe the catalog has verified holds the
encoder's bytes on its holder's device, and a restarted holder keeps none of the killed attempt's
scratch.

And the other holder a rebuild meets: c, one of the holders e reads from, killed while it sends
its stripe; e's attempt is retried until c's worker is back, then the same checks hold."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client
from tierpoint_client.erasure.files import StripeFile, decode_path

from tests.helpers.coded_tier import (
    CODE,
    SECRET,
    StripeRow,
    coded_settings,
    declare_lost,
    restore_on_spare,
    spare_plan,
    stripe_rows,
)
from tests.helpers.faults import (
    OVERALL_TIMEOUT,
    db_now,
    eventually,
    wait_for_retry,
    workers_reported_in,
)
from tests.helpers.lifecycle import (
    RESULT_TIMEOUT,
    ShardSpec,
    crc_hex,
    markers,
    new_job,
    random_shards,
    run_lifecycle,
    running_workers,
    seed_checkpoint,
)
from tests.helpers.peer_faults import data_url, wait_for_endpoints
from tests.helpers.services import with_tier
from tests.helpers.worker_process import WorkerProcess, worker_process
from tierpoint.config import Settings
from tierpoint.contract.peer import rereplicate_id
from tierpoint.contract.stripes import REBUILD_BATCH
from tierpoint.storage.posix.staging import STAGING_DIR

# One file of six segments and a bit: each stripe ~12 MiB, more than a loopback socket's buffer
# takes at once.
FILE_BYTES = 24 * 1024 * 1024 + 4099
# Once the copy is made, c's and d's endpoints send at 2 MiB/s: each stripe's fetch takes
# seconds, so the killed batch is caught with part of a stripe fetched.
READ_LIMIT = 2 * 1024 * 1024
# How soon the killed attempt is retried on the restarted worker.
HEARTBEAT_TIMEOUT = 5.0
TOO_LATE = "the rebuild on e finished before e could be killed: slow c and d (READ_LIMIT)"


def _good(rows: list[StripeRow]) -> list[StripeRow]:
    """The stripes verified on holders not lost: the ones a set counts."""
    return [r for r in rows if r.state == "verified" and not r.holder_lost]


def _files(root: Path) -> set[str]:
    """Every file under a holder's root of the tier, its staging area aside."""
    return {
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.is_file() and p.relative_to(root).parts[0] != STAGING_DIR
    }


def _scratch(tmp: Path) -> dict[str, int]:
    """Files under a worker process's TMPDIR, with their sizes."""
    return {str(p.relative_to(tmp)): p.stat().st_size for p in tmp.rglob("*") if p.is_file()}


@pytest.mark.parametrize("then", ["restarted", "declared lost"])
async def test_a_new_holder_killed_mid_rebuild(
    then: str,
    settings: Settings,
    sessions: sessionmaker[Session],
    client: Client,
    engine: Engine,
    tmp_path: Path,
) -> None:
    tag = uuid.uuid4().hex[:8]
    # Sorted ids form the ring: a's stripes go to b, c, d; a new holder of b's is e, then f.
    a, b, c, d, e, f = (f"{tag}-{x}" for x in "abcdef")
    nodes = [a, b, c, d, e, f]
    base = coded_settings(
        settings,
        tmp_path,
        nodes=nodes,
        below=("lustre",),
        data_token=SECRET,
        batch_heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT,
    )
    slow = with_tier(base, "coded", read_bandwidth_limit=READ_LIMIT)
    shards = random_shards([a], 1, FILE_BYTES)
    every_file = {sh.path: sh.data for sh in shards}
    seeded = seed_checkpoint(base, sessions, new_job(), 1, shards)
    job, cp = seeded.job, seeded.checkpoint_id

    def rows() -> list[StripeRow]:
        return stripe_rows(sessions, cp)

    def on_e() -> list[StripeRow]:
        return [r for r in rows() if r.holder == e]

    e_tmp = tmp_path / "e-tmp"
    e_tmp.mkdir()
    since = db_now(engine)

    async def declare(node: str) -> None:
        await declare_lost(base, node, client)

    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(running_workers(base, client, [a, b, f], shared=False))
        holders = await stack.enter_async_context(contextlib.AsyncExitStack())
        await holders.enter_async_context(running_workers(base, client, nodes=[c, d], shared=False))
        killed = stack.enter_context(
            worker_process(base, e, tmp_path / "e.log", env={"TMPDIR": str(e_tmp)})
        )
        await workers_reported_in(engine, tuple(nodes), since)
        # The shared worker refuses a code the nodes it knows cannot hold: it starts after them.
        await stack.enter_async_context(running_workers(base, client, nodes=(), shared=True))
        result, _ = await run_lifecycle(client, seeded)
        assert {t.tier: t.state.value for t in result.tiers}["coded"] == "restorable"
        assert {r.holder for r in rows()} == {b, c, d}

        # c and d serve their stripes slowly from now on: e's fetch of them is caught mid-way.
        served = {n: data_url(sessions, n) for n in (c, d)}
        await holders.aclose()
        await stack.enter_async_context(running_workers(slow, client, nodes=[c, d], shared=False))
        for n in (c, d):
            await wait_for_endpoints(sessions, [n], OVERALL_TIMEOUT, not_=served[n])
        await declare(b)

        await _kill_mid_fetch(killed, on_e, e_tmp)
        # The killed attempt's half-fetched stripes, as it left them: in its scratch, nothing
        # under e's root of the tier, and e's stripe not offered to a reader.
        assert _scratch(e_tmp), killed.output()
        assert _files(base.tier("coded").root_for(e)) == set()
        offered = {st.node for entry in spare_plan(base, sessions, job) for st in entry.stripes}
        assert offered == {c, d}, offered

        if then == "restarted":
            # Serves e's queue and endpoint until the end: the restore reads e's stripes.
            again = stack.enter_context(
                worker_process(base, e, tmp_path / "e-again.log", env={"TMPDIR": str(e_tmp)})
            )
            new_holder, live_nodes = e, [a, c, d, e, f]
        else:
            await declare(e)
            new_holder, live_nodes = f, [a, c, d, f]
        handle = client.get_workflow_handle(rereplicate_id(job, 1))
        await asyncio.wait_for(handle.result(), RESULT_TIMEOUT)
        if then == "restarted":
            assert again.alive(), again.output()
            # The restarted holder keeps nothing of the attempt killed on it.
            assert _scratch(e_tmp) == {}

        _assert_whole_and_clean(base, rows(), job, {new_holder, c, d}, live_nodes)
        assert markers(sessions, cp)["coded"][0] == "restorable"
        _assert_decodes_from_rebuilt(base, rows(), job, shards, new_holder, tmp_path)
        # The client's restore on a spare, from the holders' endpoints.
        plan = spare_plan(base, sessions, job)
        assert {entry.tier for entry in plan} == {"coded"}
        assert await asyncio.to_thread(restore_on_spare, plan, tmp_path / "spare") == every_file


async def test_a_holder_read_from_killed_mid_rebuild_is_read_again_once_back(
    settings: Settings,
    sessions: sessionmaker[Session],
    client: Client,
    engine: Engine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The other holder a rebuild meets killed: c, one of the two holders e cuts b's stripe from,
    is SIGKILLed while it sends its stripe. e's attempt finds the set short of k readable stripes
    and fails, retried (c is down, not declared lost); once c's worker is back (its endpoint at a
    new address), the stripe is cut and verified on e, and nothing half-fetched is left."""
    tag = uuid.uuid4().hex[:8]
    a, b, c, d, e, f = (f"{tag}-{x}" for x in "abcdef")
    nodes = [a, b, c, d, e, f]
    base = coded_settings(settings, tmp_path, nodes=nodes, below=("lustre",), data_token=SECRET)
    shards = random_shards([a], 1, FILE_BYTES)
    seeded = seed_checkpoint(base, sessions, new_job(), 1, shards)
    job, cp = seeded.job, seeded.checkpoint_id
    # e's worker runs in this process: its scratch in a temp directory of the test's.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    e_scratch = tmp_path / "tmp" / "tierpoint-rebuild"
    since = db_now(engine)

    def on_e() -> list[StripeRow]:
        return [r for r in stripe_rows(sessions, cp) if r.holder == e]

    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(running_workers(base, client, [a, b, d, e, f], False))
        source = stack.enter_context(worker_process(base, c, tmp_path / "c.log"))
        await workers_reported_in(engine, tuple(nodes), since)
        await stack.enter_async_context(running_workers(base, client, nodes=(), shared=True))
        result, _ = await run_lifecycle(client, seeded)
        assert {t.tier: t.state.value for t in result.tiers}["coded"] == "restorable"
        # c serves its stripe slowly from now on: e's fetch of it is caught mid-way.
        served = data_url(sessions, c)
        source.kill()
        source = stack.enter_context(
            worker_process(
                with_tier(base, "coded", read_bandwidth_limit=READ_LIMIT), c, tmp_path / "c2.log"
            )
        )
        await wait_for_endpoints(sessions, [c], OVERALL_TIMEOUT, not_=served)
        await declare_lost(base, b, client)
        await _kill_mid_fetch(source, on_e, e_scratch)

        handle = client.get_workflow_handle(rereplicate_id(job, 1))
        failure = await wait_for_retry(handle, REBUILD_BATCH)
        assert "readable others" in failure, failure
        served = data_url(sessions, c)
        stack.enter_context(worker_process(base, c, tmp_path / "c3.log"))
        await wait_for_endpoints(sessions, [c], OVERALL_TIMEOUT, not_=served)
        await asyncio.wait_for(handle.result(), RESULT_TIMEOUT)

        assert _scratch(e_scratch) == {}
        final = stripe_rows(sessions, cp)
        _assert_whole_and_clean(base, final, job, {e, c, d}, [a, c, d, e, f])
        assert markers(sessions, cp)["coded"][0] == "restorable"
        _assert_decodes_from_rebuilt(base, final, job, shards, e, tmp_path)
        plan = spare_plan(base, sessions, job)
        restored = await asyncio.to_thread(restore_on_spare, plan, tmp_path / "spare")
        assert restored == {sh.path: sh.data for sh in shards}


async def _kill_mid_fetch(
    killed: WorkerProcess, on_e: Callable[[], list[StripeRow]], scratch: Path
) -> None:
    """SIGKILL the new holder's worker once part of a stripe of its batch is in its scratch:
    some of the stripe's bytes fetched, not all."""

    async def transferring() -> bool:
        held = await asyncio.to_thread(on_e)
        assert not held or {r.state for r in held} != {"verified"}, TOO_LATE
        fetched = await asyncio.to_thread(_scratch, scratch)
        return any(0 < n < min((r.size for r in held), default=0) for n in fetched.values())

    await eventually("the new holder fetching the stripes it rebuilds", transferring)
    assert killed.kill() == -9, killed.output()
    assert {r.state for r in on_e()} != {"verified"}, TOO_LATE


def _assert_whole_and_clean(
    settings: Settings, final: list[StripeRow], job: str, holders: set[str], live_nodes: list[str]
) -> None:
    """Every set whole on `holders`; every stripe the catalog has verified holds the encoder's
    bytes on its holder's device; no live node keeps a file the catalog does not name there (no
    temp file of the killed attempt, on e or wherever the stripes went; a lost node's device is
    given up, and its endpoint serves nothing)."""
    tier = settings.tier("coded")
    for path in {r.path for r in final}:
        live = [r for r in _good(final) if r.path == path]
        assert len(live) == CODE.width and {r.holder for r in live} == holders, final
    for r in _good(final):
        held = (tier.root_for(r.holder) / job / "1" / r.path).read_bytes()
        assert (len(held), crc_hex(held)) == (r.size, r.crc32c), r
    for node in live_nodes:
        named = {f"{job}/1/{r.path}" for r in final if r.holder == node}
        assert _files(tier.root_for(node)) <= named, node


def _assert_decodes_from_rebuilt(
    settings: Settings,
    final: list[StripeRow],
    job: str,
    shards: list[ShardSpec],
    new_holder: str,
    tmp_path: Path,
) -> None:
    """Each file decoded from its rebuilt stripe and one other, off their holders' devices."""
    tier = settings.tier("coded")
    for sh in shards:
        held = {r.stripe_index: r for r in _good(final) if r.path == sh.path}
        rebuilt = next(i for i, r in held.items() if r.holder == new_holder)
        other = next(i for i in held if i != rebuilt)
        files = [
            StripeFile(i, tier.root_for(held[i].holder) / job / "1" / sh.path, held[i].crc32c)
            for i in (rebuilt, other)
        ]
        out = tmp_path / "decoded" / sh.path
        out.parent.mkdir(parents=True, exist_ok=True)
        decode_path(CODE, len(sh.data), crc_hex(sh.data), files, out)
        assert out.read_bytes() == sh.data
