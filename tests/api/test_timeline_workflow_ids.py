"""A step saved again after a rollback is another checkpoint, and everything of it is its own: a
reader's report lands on the checkpoint it names by its branch, and an operator verifies the
shared tier's copies of both step-20 checkpoints at once (the superseded one and the one saved
again): each run reads its own checkpoint's files, finds the byte changed behind tierpoint's back
there, and the repair each one starts copies its own files back. Before, both runs were keyed by
(job, step): the second joined the first, and one checkpoint stayed unread and unrepaired."""

from __future__ import annotations

import asyncio
from pathlib import Path

import crc32c
import httpx
from temporalio.client import Client

from api.app import create_app
from tests.helpers.api import NODE_A, manifest, running_client, shard
from tests.helpers.lifecycle import running_workers
from tierpoint.config import Settings
from tierpoint.contract.integrity import RepairResult

# Guards against a hang, not a performance assertion.
TIMEOUT = 180.0
ALL_GOOD = {"ssd": "restorable", "lustre": "restorable", "s3": "restorable"}


def _dir(settings: Settings, tier: str, node: str | None, job: str, step_dir: str) -> Path:
    return settings.tier(tier).root_for(node) / job / step_dir


async def _tiers(c: httpx.AsyncClient, job: str, step: int, branch: int) -> dict[str, str]:
    r = await c.get(f"/v1/jobs/{job}/checkpoints/{step}", params={"branch": branch})
    assert r.status_code == 200, r.text
    return {t["tier"]: t["state"] for t in r.json()["tiers"]}


async def _until_good(c: httpx.AsyncClient, job: str, step: int, branch: int) -> None:
    async with asyncio.timeout(TIMEOUT):
        while True:
            if await _tiers(c, job, step, branch) == ALL_GOOD:
                return
            await asyncio.sleep(0.2)


async def _until_restorable(
    c: httpx.AsyncClient, job: str, step: int, branch: int, tier: str
) -> None:
    async with asyncio.timeout(TIMEOUT):
        while True:
            if (await _tiers(c, job, step, branch)).get(tier) == "restorable":
                return
            await asyncio.sleep(0.2)


async def _save(
    c: httpx.AsyncClient, settings: Settings, job: str, step: int, branch: int, data: bytes
) -> None:
    """Write the checkpoint's one file where its writer would (`<step>.b<N>` after a rollback),
    register it, and wait until every tier holds it."""
    step_dir = str(step) if branch == 1 else f"{step}.b{branch}"
    local = _dir(settings, "ssd", NODE_A, job, step_dir)
    local.mkdir(parents=True, exist_ok=True)
    (local / "a.bin").write_bytes(data)
    body = manifest(step, [shard("a.bin", size=len(data), crc=f"{crc32c.crc32c(data):08x}")])
    if branch != 1:
        body["branch"] = branch
    r = await c.post(f"/v1/jobs/{job}/checkpoints", json=body)
    assert r.status_code == 201, r.text
    await _until_good(c, job, step, branch)


async def _reported(c: httpx.AsyncClient, job: str, branch: int) -> list[str]:
    r = await c.get(f"/v1/jobs/{job}/checkpoints/20/events", params={"branch": branch})
    assert r.status_code == 200, r.text
    return [e["detail"]["path"] for e in r.json()["items"] if e["kind"] == "corrupt_reported"]


async def _verify(c: httpx.AsyncClient, job: str, step: int, branch: int) -> dict[str, object]:
    """The answer once the run completed (asking again while it runs joins it)."""
    async with asyncio.timeout(TIMEOUT):
        while True:
            r = await c.post(
                f"/v1/jobs/{job}/checkpoints/{step}/verify",
                params={"branch": branch},
                json={"tier": "lustre"},
            )
            assert r.status_code == 202, r.text
            body: dict[str, object] = r.json()
            if body["status"] != "running":
                return body


async def test_both_checkpoints_of_a_step_are_verified_and_repaired_at_once(
    settings: Settings, temporal: Client, nodes: tuple[str, str], job: str
) -> None:
    first, again = b"branch one " * 4000, b"branch two " * 4000
    async for c in running_client(create_app(settings)):
        async with running_workers(settings, temporal):
            await _save(c, settings, job, 10, 1, b"ten " * 4000)
            await _save(c, settings, job, 20, 1, first)
            r = await c.post(f"/v1/jobs/{job}/rollback", json={"step": 10, "from_branch": 1})
            assert r.status_code == 201, r.text
            await _save(c, settings, job, 20, 2, again)

            # A reader's report names the checkpoint it read: the superseded one's history has
            # it, the other's does not (the server reads the copy back: good, nothing changes).
            r = await c.post(
                f"/v1/jobs/{job}/checkpoints/20/corrupt-copies",
                params={"branch": 1},
                json={"tier": "lustre", "path": "a.bin", "reason": "my read failed"},
            )
            assert r.status_code == 202, r.text
            assert await _reported(c, job, 1) == ["a.bin"]
            assert await _reported(c, job, 2) == []

            # A byte of each step-20 checkpoint's shared-tier copy changes behind our back.
            files = {
                1: _dir(settings, "lustre", None, job, "20") / "a.bin",
                2: _dir(settings, "lustre", None, job, "20.b2") / "a.bin",
            }
            for f in files.values():
                data = bytearray(f.read_bytes())
                data[100] ^= 0x01
                f.write_bytes(bytes(data))

            one, two = await asyncio.gather(_verify(c, job, 20, 1), _verify(c, job, 20, 2))
            # Branch 1 keeps the ids it always had; a later branch's name the checkpoint's
            # directory, as its lifecycle's does.
            assert one["workflow_id"] == f"checkpoint/{job}/20/verify/lustre", one
            assert two["workflow_id"] == f"checkpoint/{job}/20.b2/verify/lustre", two
            for run in (one, two):
                outcome = run["outcome"]
                assert run["status"] == "completed" and isinstance(outcome, dict), run
                assert (outcome["read"], outcome["corrupt"]) == (1, 1), run
                assert outcome["repair_requested"] is True, run

            # Each checkpoint's repair runs under its own id and copies its own bytes back (the
            # superseded one's node-local copy may be expired meanwhile: it expires first).
            ids = {}
            for branch, where in ((1, "20"), (2, "20.b2")):
                handle = temporal.get_workflow_handle(
                    f"checkpoint/{job}/{where}/repair", result_type=RepairResult
                )
                ids[branch] = (await asyncio.wait_for(handle.result(), TIMEOUT)).checkpoint_id
                await _until_restorable(c, job, 20, branch, "lustre")
            assert len(set(ids.values())) == 2, ids
            assert files[1].read_bytes() == first and files[2].read_bytes() == again
