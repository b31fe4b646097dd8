"""Lightning Fabric's `fabric.save` / `fabric.load` with a `tierpoint://<job>/step-<N>/<file>`
path on the real stack, one process and DDP over two (gloo). Lightning writes its one file inside
an fsspec transaction (`autocommit=False`): the transaction's commit registers the checkpoint,
once, and the file loads back verified from the local tier and, that wiped, the shared tiers'
copies. A transaction given up leaves nothing."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from tierpoint_client import NotFoundError

from tests.client.torch.ranks import WAIT, new_job, rank_env, wait_everywhere, wipe_local
from tests.client.torch.test_dcp import api_requests
from tests.client.trainers.trainer import TRAINERS_PYTHON
from tests.helpers.client import Stack

pytestmark = pytest.mark.full_stack

SCRIPT = Path(__file__).with_name("fabric_rank.py")


async def fabric(
    stack: Stack, tmp: Path, action: str, url: str, *, world: int = 1
) -> list[dict[str, Any]]:
    """Each process's report, in rank order."""
    run = tmp / f"{action}-{uuid.uuid4().hex[:8]}"
    run.mkdir(parents=True)
    launch = [str(TRAINERS_PYTHON)]
    if world > 1:
        launch += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}"]
    cmd = [*launch, str(SCRIPT), action, "--url", url, "--out", str(run / "report")]
    env = rank_env(stack) | {"TIERPOINT_NODE": stack.nodes[0], "TMPDIR": str(run)}
    proc = await asyncio.create_subprocess_exec(
        *cmd, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(proc.communicate(), WAIT)
    assert proc.returncode == 0, out.decode(errors="replace")
    return [json.loads((run / f"report.{r}").read_text()) for r in range(world)]


def ok(reports: list[dict[str, Any]], *, loaded: bool) -> None:
    for r in reports:
        assert "error" not in r, reports
        if loaded:
            assert r["same"] is True, reports


@pytest.mark.parametrize("world", [1, 2])
async def test_fabric_saves_through_a_transaction_registered_once_and_loads_back(
    stack: Stack, tmp_path: Path, world: int
) -> None:
    job, step = new_job("fabric"), 3
    url = f"tierpoint://{job}/step-{step}/fabric.ckpt"
    before = await api_requests(stack)
    ok(await fabric(stack, tmp_path, "save", url, world=world), loaded=False)
    # Global rank 0 alone saves: the pre-save checks (the token may register the job, the step
    # is not registered), this node's tier lookup and one registration.
    assert await api_requests(stack) - before == 4

    cp = await wait_everywhere(stack, job, step)
    assert [(s.path, s.node) for s in cp.shards or ()] == [("fabric.ckpt", stack.nodes[0])]
    assert [p.name for p in stack.local_dir(stack.nodes[0], job, step).iterdir()] == ["fabric.ckpt"]
    ok(await fabric(stack, tmp_path, "load", url, world=world), loaded=True)
    wipe_local(stack, job)
    ok(await fabric(stack, tmp_path, "load", url, world=world), loaded=True)


async def test_a_given_up_transaction_registers_and_leaves_nothing(
    stack: Stack, tmp_path: Path
) -> None:
    job = new_job("fabric")
    reports = await fabric(stack, tmp_path, "discard", f"tierpoint://{job}/step-1/fabric.ckpt")
    assert reports[0]["error"] == "RuntimeError: the save failed", reports
    with pytest.raises(NotFoundError):
        await asyncio.to_thread(stack.client.checkpoint, job, 1)
    local = stack.local_dir(stack.nodes[0], job, 1)
    assert not local.exists() or list(local.iterdir()) == []
