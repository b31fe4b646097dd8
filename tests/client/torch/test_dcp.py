"""torch.distributed.checkpoint through tierpoint on the real stack: ranks of real processes (gloo,
each its own simulated node) save with TierpointWriter and load with TierpointReader.

The ranks run in `.venv-torch` (torch and the client, none of the server's packages; built by
`python3 bootstrap.py test`); each checks the values it loaded against the state it knows was
saved and reports back in JSON.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import httpx
import pytest
from tierpoint_client import NotFoundError

from tests.client.torch.ranks import (
    WAIT,
    assert_loaded,
    corrupt_file,
    corrupt_s3,
    new_job,
    ranks,
    run_ranks,
    wait_everywhere,
    wipe_local,
)
from tests.helpers.client import Stack
from tests.helpers.scrape import http_get, parse
from tests.helpers.tokens import bearer

FILES = {"__0_0.distcp", "__1_0.distcp", ".metadata"}
# What a save and a load cost the API at any world size: the coordinator's step check, the job's
# current branch (a writer that followed no load asks it), tier lookup and registration; the one
# request that starts a load, the branch the run then saves on, and the lease's release (and,
# when a rank keeps another node's file on its node, the one request that records those files).
SAVE_REQUESTS, LOAD_REQUESTS, KEEPING = 4, 3, 1


async def api_requests(stack: Stack) -> float:
    """Every request the stack's API has answered, as its metrics count them."""
    async with asyncio.timeout(WAIT):
        while not stack.api_idle():  # noqa: ASYNC110 (uvicorn's state has no event to wait on)
            await asyncio.sleep(0.05)
    samples = parse(await asyncio.to_thread(http_get, stack.metrics_port))
    return sum(v for (name, _), v in samples.items() if name == "tierpoint_api_requests_total")


async def test_save_two_ranks_then_load_from_shared_and_s3_with_two_and_one(
    stack: Stack, tmp_path: Path
) -> None:
    """Also what each save and load costs the API, counted by the server: the coordinator alone
    talks to it (and hands the other ranks what they need through DCP's planning), so the count
    is the same at any world size, and a load holds one lease, released once."""
    job, step = new_job(), 10
    before = await api_requests(stack)
    saved = await ranks(stack, tmp_path, "save", job, world=2, step=step)
    assert await api_requests(stack) - before == SAVE_REQUESTS
    assert [r["registered"] for r in saved] == [True, False]  # the coordinator registers once

    cp = await wait_everywhere(stack, job, step)
    assert cp.metadata == {"saved_by": "dcp_rank"}
    assert {s.path for s in cp.shards or ()} == FILES
    node_a, node_b = stack.nodes
    assert {s.path: s.node for s in cp.shards or ()} == {
        "__0_0.distcp": node_a,
        "__1_0.distcp": node_b,
        ".metadata": node_a,
    }
    # Each rank wrote only on its own node, and nothing but the files (no temporary leftovers).
    assert {p.name for p in stack.local_dir(node_a, job, step).iterdir()} == {
        "__0_0.distcp",
        ".metadata",
    }
    assert {p.name for p in stack.local_dir(node_b, job, step).iterdir()} == {"__1_0.distcp"}

    wipe_local(stack, job)
    load_requests, keeping = {}, {}
    owner = {s.path: s.node for s in cp.shards or ()}
    for tier in ("lustre", "s3"):
        for world in (2, 1):
            before = await api_requests(stack)
            loaded = await ranks(stack, tmp_path, "load", job, world=world, tier=tier)
            load_requests[tier, world] = await api_requests(stack) - before
            assert_loaded(loaded, step)
            assert [r["warnings"] for r in loaded] == [[]] * world
            # Rank r runs on node r: did a rank keep another node's file on its own?
            keeping[tier, world] = any(
                owner[p] != node
                for r, node in zip(loaded, stack.nodes, strict=False)
                for p in r["stats"]["repopulated"]
            )
    # One lease per load, each released: none is active any more.
    leases = await asyncio.to_thread(
        stack.client._http.request,
        "GET",
        f"/v1/jobs/{job}/checkpoints/{step}/leases",
        query={"all": "true"},
    )
    assert [x["active"] for x in leases.body["items"]] == [False] * 4, leases.body
    # One rank alone reads node b's file too, and keeps it on node a.
    assert keeping["lustre", 1] and keeping["s3", 1], keeping
    assert load_requests == {
        load: LOAD_REQUESTS + (KEEPING if kept else 0) for load, kept in keeping.items()
    }, (load_requests, keeping)


async def test_a_save_of_one_rank_costs_the_api_what_a_save_of_two_does(
    stack: Stack, tmp_path: Path
) -> None:
    before = await api_requests(stack)
    await ranks(stack, tmp_path, "save", new_job(), world=1, step=1)
    assert await api_requests(stack) - before == SAVE_REQUESTS


async def test_async_save_saves_the_staged_state(stack: Stack, tmp_path: Path) -> None:
    job, step = new_job(), 20
    saved = await ranks(stack, tmp_path, "async_save", job, world=2, step=step)
    assert [r["registered"] for r in saved] == [True, False]
    await wait_everywhere(stack, job, step)
    # From the local tiers (each rank's node has its own file), then with one rank (node a reads
    # node b's file from the shared tier).
    assert_loaded(await ranks(stack, tmp_path, "load", job, world=2), step)
    loaded = await ranks(stack, tmp_path, "load", job, world=1)
    assert_loaded(loaded, step)


async def test_a_corrupt_shared_copy_is_read_from_s3(stack: Stack, tmp_path: Path) -> None:
    job, step = new_job(), 30
    await ranks(stack, tmp_path, "save", job, world=2, step=step)
    await wait_everywhere(stack, job, step)
    wipe_local(stack, job)
    original = (stack.shared_dir(job, step) / "__1_0.distcp").read_bytes()
    corrupt_file(stack.shared_dir(job, step) / "__1_0.distcp")

    loaded = await ranks(stack, tmp_path, "load", job, world=2)
    assert_loaded(loaded, step)
    warned = [w for r in loaded for w in r["warnings"]]
    # The wiped local copies are missing, the shared one fails verification, S3's is read.
    assert any("__1_0.distcp on tier lustre failed verification" in w for w in warned), warned
    assert any("on tier ssd could not be read" in w for w in warned), warned

    # The bad copy was reported; the server read it back, confirmed it and repaired it (its
    # first try may read the wiped local copy, find it gone and go on from S3 in a later round).
    async def history() -> list[tuple[str, str | None]]:
        async with httpx.AsyncClient(base_url=stack.api_url, headers=bearer(stack.token)) as api:
            r = await api.get(f"/v1/jobs/{job}/checkpoints/{step}/events", params={"limit": 1000})
            assert r.status_code == 200, r.text
            items = r.json()["items"]
        mended = [e for e in items if e["kind"] == "repaired" and e["detail"].get("repaired")]
        return [(e["kind"], e["tier"]) for e in items if e["kind"] != "repaired"] + [
            ("repaired", e["tier"]) for e in mended
        ]

    async with asyncio.timeout(WAIT):
        while ("repaired", "lustre") not in (seen := await history()):  # noqa: ASYNC110 (polling the API)
            await asyncio.sleep(0.5)
    assert ("corrupt_reported", "lustre") in seen and ("corrupt", "lustre") in seen, seen
    assert (stack.shared_dir(job, step) / "__1_0.distcp").read_bytes() == original


async def test_a_newest_checkpoint_corrupt_everywhere_loads_the_previous_step(
    stack: Stack, tmp_path: Path
) -> None:
    job = new_job()
    await ranks(stack, tmp_path, "save", job, world=2, step=40)
    await ranks(stack, tmp_path, "save", job, world=2, step=50)
    await wait_everywhere(stack, job, 40)
    newest = await wait_everywhere(stack, job, 50)
    for node in stack.nodes:
        shutil.rmtree(stack.local_dir(node, job, 50))
    for path in FILES:
        corrupt_file(stack.shared_dir(job, 50) / path)
        corrupt_s3(stack, newest, path)

    loaded = await ranks(stack, tmp_path, "load", job, world=1)
    assert_loaded(loaded, 40)
    assert any(
        f"{job}/50: no verified copy of '.metadata'" in w
        and "loading the next older restorable step 40" in w
        for w in loaded[0]["warnings"]
    ), loaded[0]["warnings"]


async def test_a_save_failing_on_one_rank_registers_nothing(stack: Stack, tmp_path: Path) -> None:
    job, step = new_job(), 60
    # Rank 1 cannot create its checkpoint directory: a file stands where it must go.
    blocked = stack.local_dir(stack.nodes[1], job, step)
    blocked.parent.mkdir(parents=True)
    blocked.write_bytes(b"in the way")
    await ranks(stack, tmp_path, "save", job, world=2, step=step, expect_ok=False)
    with pytest.raises(NotFoundError):
        await asyncio.to_thread(stack.client.checkpoint, job, step)


async def test_saving_a_registered_step_again_fails_before_any_file_is_written(
    stack: Stack, tmp_path: Path
) -> None:
    job, step = new_job(), 90
    await ranks(stack, tmp_path, "save", job, world=2, step=step)
    before = {
        node: {p.name: p.read_bytes() for p in stack.local_dir(node, job, step).iterdir()}
        for node in stack.nodes
    }
    # DCP's .metadata differs on every save: a second save would overwrite the registered files.
    failed = await run_ranks(stack, tmp_path, "save", job, world=2, step=step, expect_ok=False)
    assert f"{job}/{step} is already registered" in failed.logs, failed.logs
    after = {
        node: {p.name: p.read_bytes() for p in stack.local_dir(node, job, step).iterdir()}
        for node in stack.nodes
    }
    assert after == before


@pytest.mark.parametrize("what", ["step", "job"])
async def test_ranks_that_disagree_on_what_they_save_fail_before_any_byte_is_written(
    stack: Stack, tmp_path: Path, what: str
) -> None:
    """Rank 1 names another step (or job) than the coordinator. Every rank's save fails with the
    disagreement, nothing is registered under either name, and no rank wrote a file."""
    job, step = new_job(), 70
    other_job, other_step = (job, step + 1) if what == "step" else (new_job(), step)
    failed = await run_ranks(
        stack,
        tmp_path,
        "save",
        job,
        world=2,
        step=step,
        extra=("--disagree", f"1:{other_job}/{other_step}"),
        expect_ok=False,
    )
    said = f"rank 1 saves {other_job}/{other_step}"
    for rank in range(2):
        log = failed.logs.split(f"--- rank {rank}\n")[1].split("--- rank")[0]
        assert "SaveMismatchError" in log and said in log, failed.logs
    for name, n in ((job, step), (other_job, other_step)):
        with pytest.raises(NotFoundError):
            await asyncio.to_thread(stack.client.checkpoint, name, n)
        for node in stack.nodes:
            assert not stack.local_dir(node, name, n).exists()
