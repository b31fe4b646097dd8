"""A trainer that forks after a `dcp.load` (its DataLoader's workers, a multiprocessing pool):
the child loads through tierpoint on its own threads and connections, even when a thread of the
parent was inside the client's locks at the fork (the load's API pool, the reader threads' pool,
the S3 clients, the data endpoints' connections), and the parent loads on after it. A real rank
process (`fork_rank.py`) on a real stack, loading from S3."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from tests.client.torch.ranks import TORCH_PYTHON, WAIT, new_job, rank_env, ranks, wait_everywhere
from tests.helpers.client import Stack

FORK_SCRIPT = Path(__file__).with_name("fork_rank.py")


async def test_a_trainer_forked_after_a_load_loads_in_the_child_and_on_in_the_parent(
    stack: Stack, tmp_path: Path
) -> None:
    job, step = new_job("fork"), 3
    await ranks(stack, tmp_path, "save", job, world=1, step=step)
    await wait_everywhere(stack, job, step, tiers=("s3",))

    out = tmp_path / "fork.json"
    cmd = [str(TORCH_PYTHON), str(FORK_SCRIPT), "--job", job, "--step", str(step)]
    proc = await asyncio.create_subprocess_exec(
        *cmd,
        "--tier",
        "s3",
        "--out",
        str(out),
        env={**rank_env(stack), "TIERPOINT_NODE": stack.nodes[0]},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(proc.communicate(), WAIT)
    assert proc.returncode == 0, output.decode(errors="replace")
    # What each load got wrong: nothing, in the parent, the child and the parent after it.
    assert json.loads(out.read_text()) == {"parent": [], "child": [], "parent_again": []}
