"""`dcp.save` / `dcp.load` by URL (`checkpoint_id="tierpoint://<job>/step-<N>"`), with no writer
or reader object, on the real stack: ranks of real processes (gloo, each its own simulated node)
in `.venv-torch`, where fsspec finds `tierpoint://` through the client's entry point. What DCP
writes lands where TierpointWriter puts it and is registered once, at DCP's commit (the rename of
`.metadata.tmp`), with every rank's file on its node; what it loads comes back verified."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tierpoint_client import NotFoundError

from tests.client.torch.ranks import (
    TORCH_PYTHON,
    WAIT,
    new_job,
    rank_env,
    wait_everywhere,
    wipe_local,
)
from tests.client.torch.test_dcp import api_requests
from tests.helpers.client import Stack
from tests.helpers.tokens import create_token

RANK_SCRIPT = Path(__file__).with_name("url_rank.py")
FILES = {"__0_0.distcp", "__1_0.distcp", ".metadata"}
# A save by URL, at any world size: the coordinator's two checks, its tier lookup, the registration.
SAVE_REQUESTS = 4


async def url_ranks(
    stack: Stack,
    tmp: Path,
    action: str,
    url: str,
    step: int,
    *,
    world: int,
    env: Mapping[str, str | None] | None = None,
) -> list[dict[str, Any]]:
    """Run `world` ranks (rank i on node i) to completion; their reports, in rank order."""
    run = tmp / f"{action}-{uuid.uuid4().hex[:8]}"
    run.mkdir(parents=True)
    procs = []
    for rank in range(world):
        cmd = [str(TORCH_PYTHON), str(RANK_SCRIPT), action, "--url", url, "--step", str(step)]
        cmd += ["--rank", str(rank), "--world", str(world), "--init-file", str(run / "pg")]
        cmd += ["--out", str(run / f"rank{rank}.json")]
        rank_vars: dict[str, str | None] = {**rank_env(stack), "TIERPOINT_NODE": stack.nodes[rank]}
        rank_vars |= env or {}
        procs.append(
            await asyncio.create_subprocess_exec(
                *cmd,
                env={k: v for k, v in rank_vars.items() if v is not None},
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            )
        )
    outputs = await asyncio.wait_for(asyncio.gather(*(p.communicate() for p in procs)), WAIT)
    logs = "\n".join(
        f"--- rank {i}\n{o[0].decode(errors='replace')}" for i, o in enumerate(outputs)
    )
    assert [p.returncode for p in procs] == [0] * world, logs
    return [json.loads((run / f"rank{i}.json").read_text()) for i in range(world)]


def ok(reports: list[dict[str, Any]]) -> None:
    for r in reports:
        assert "error" not in r, reports
        assert r.get("mismatches", []) == [], reports


async def test_two_ranks_save_by_url_register_once_and_load_back_from_every_tier(
    stack: Stack, tmp_path: Path
) -> None:
    job, step = new_job("url"), 2
    url = f"tierpoint://{job}/step-{step}"
    before = await api_requests(stack)
    ok(await url_ranks(stack, tmp_path, "save", url, step, world=2))
    save_requests = await api_requests(stack) - before

    cp = await wait_everywhere(stack, job, step)
    node_a, node_b = stack.nodes
    # Every rank's file with its own node, and `.metadata` with the coordinator's.
    assert {s.path: s.node for s in cp.shards or ()} == {
        "__0_0.distcp": node_a,
        "__1_0.distcp": node_b,
        ".metadata": node_a,
    }
    # Where TierpointWriter writes, and nothing else (no `.metadata.tmp`, no temporary files).
    assert {p.name for p in stack.local_dir(node_a, job, step).iterdir()} == {
        "__0_0.distcp",
        ".metadata",
    }
    assert {p.name for p in stack.local_dir(node_b, job, step).iterdir()} == {"__1_0.distcp"}

    before = await api_requests(stack)
    ok(await url_ranks(stack, tmp_path, "load", url, step, world=2))
    load_requests = await api_requests(stack) - before
    # The other tiers: the local copies gone, two ranks and one (DCP reshards) read the shared
    # tier's copies, verified.
    wipe_local(stack, job)
    ok(await url_ranks(stack, tmp_path, "load", url, step, world=2))
    ok(await url_ranks(stack, tmp_path, "load", url, step, world=1))
    # Every lease the loads took was released when the ranks exited.
    leases = await asyncio.to_thread(
        stack.client._http.request,
        "GET",
        f"/v1/jobs/{job}/checkpoints/{step}/leases",
        query={"all": "true"},
    )
    assert [x["active"] for x in leases.body["items"]] == [False] * 3, leases.body
    # A save: the coordinator's checks (the token may register the job, the step is not
    # registered), its tier lookup and the registration; a load: the coordinator starts one
    # restore, hands it to the other rank, and releases its lease.
    assert (save_requests, load_requests) == (SAVE_REQUESTS, 2)


async def test_saves_by_url_cost_the_same_requests_at_every_world_size(
    stack: Stack, tmp_path: Path
) -> None:
    """The ranks other than the coordinator ask the API nothing: the coordinator hands them the
    local tier's root through torch.distributed's store, as they hand it their files. Each save
    here is a fresh process per rank (a restarted job, a process-based async save's), the case
    where a rank would otherwise look the tiers up again."""
    job = new_job("url")
    counts = []
    for step, world in ((6, 2), (7, 2), (9, 1)):
        before = await api_requests(stack)
        ok(
            await url_ranks(
                stack, tmp_path, "save", f"tierpoint://{job}/step-{step}", step, world=world
            )
        )
        counts.append(await api_requests(stack) - before)
    assert counts == [SAVE_REQUESTS] * 3


async def test_one_rank_saves_and_async_saves_by_url(stack: Stack, tmp_path: Path) -> None:
    job = new_job("url")
    ok(await url_ranks(stack, tmp_path, "save", f"tierpoint://{job}/step-1", 1, world=1))
    ok(await url_ranks(stack, tmp_path, "async_save", f"tierpoint://{job}/step-3", 3, world=2))
    for step in (1, 3):
        await wait_everywhere(stack, job, step, ("ssd",))
    ok(await url_ranks(stack, tmp_path, "load", f"tierpoint://{job}/step-1", 1, world=1))
    # What async_save staged, not what training changed afterwards.
    ok(await url_ranks(stack, tmp_path, "load", f"tierpoint://{job}/step-3", 3, world=2))


async def test_a_process_based_async_save_by_url_commits_from_its_background_processes(
    stack: Stack, tmp_path: Path
) -> None:
    job = new_job("url")
    url = f"tierpoint://{job}/step-8"
    ok(await url_ranks(stack, tmp_path, "process_save", url, 8, world=2))
    cp = await wait_everywhere(stack, job, 8, ("ssd",))
    node_a, node_b = stack.nodes
    assert {s.path: s.node for s in cp.shards or ()} == {
        "__0_0.distcp": node_a,
        "__1_0.distcp": node_b,
        ".metadata": node_a,
    }
    ok(await url_ranks(stack, tmp_path, "load", url, 8, world=2))


async def test_a_registered_step_is_not_saved_again(stack: Stack, tmp_path: Path) -> None:
    job = new_job("url")
    url = f"tierpoint://{job}/step-4"
    ok(await url_ranks(stack, tmp_path, "save", url, 4, world=2))
    files = {n: (stack.local_dir(n, job, 4)).iterdir() for n in stack.nodes}
    written = {n: {p.name: p.read_bytes() for p in f} for n, f in files.items()}
    again = await url_ranks(stack, tmp_path, "save", url, 5, world=2)
    for r in again:
        assert "is already registered: a step is saved once" in r["error"], again
    # Not a byte of the registered checkpoint changed, on any node.
    for node, before in written.items():
        assert {p.name: p.read_bytes() for p in stack.local_dir(node, job, 4).iterdir()} == before


async def test_bad_url_missing_token_and_foreign_job_fail_before_anything_is_written(
    stack: Stack, tmp_path: Path
) -> None:
    job = new_job("url")
    other = create_token(stack.settings.database_url, scopes=["train:someone-else-"])
    reader = create_token(stack.settings.database_url, scopes=["read"])
    cases = [
        (f"tierpoint://{job}/latest", {}, "'latest' is not a step folder", 1),
        ("tierpoint://bad job/step-1", {}, "job name 'bad job' is not valid", 1),
        (f"tierpoint://{job}/step-1", {"TIERPOINT_TOKEN": ""}, "needs a token", 2),
        # The coordinator's check fails the save on the other rank too, before it writes.
        (f"tierpoint://{job}/step-1", {"TIERPOINT_TOKEN": other}, "may not do this", 2),
        # A token that may read every job but register none.
        (f"tierpoint://{job}/step-1", {"TIERPOINT_TOKEN": reader}, "may not do this", 2),
    ]
    for url, env, message, world in cases:
        reports = await url_ranks(stack, tmp_path, "save", url, 1, world=world, env=env)
        for r in reports:
            assert message in r.get("error", ""), (url, reports)
    for node in stack.nodes:
        assert not stack.local_dir(node, job, 1).parent.exists()
    try:
        await asyncio.to_thread(stack.client.checkpoint, job, 1)
        raise AssertionError("registered")
    except NotFoundError:
        pass
