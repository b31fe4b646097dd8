"""The training guard as a training process meets it, against the real stack: after loading a
checkpoint whose writer recorded loss 1.0 and grad norm 2.0, a NaN loss, an infinite grad norm or
a loss over the spike factor marks the checkpoint bad (quarantined: `latest` walks back past it)
and ends the process with the guard's exit code; healthy steps mark it good, which
`latest(health="good")` then answers."""

from __future__ import annotations

import asyncio
import json
import math
import os
import sys
import uuid

import pytest
from tierpoint_client.guard import GUARD_EXIT_CODE

from tests.helpers.client import Stack, write_shards

WAIT = 300.0
TRAINING = """
import json, sys
from tierpoint_client import Client, Loaded
from tierpoint_client.guard import TrainingGuard

job, step, values = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
client = Client.from_env()
cp = client.checkpoint(job, step)
guard = TrainingGuard(Loaded(cp.ref, cp.metadata), steps=3, spike=5.0)
for n, (loss, grad_norm) in enumerate(values, start=step + 1):
    guard.check(n, loss=float(loss), grad_norm=float(grad_norm))
print("trained on", guard.verdict)
"""


async def _checkpoint(stack: Stack, job: str, step: int) -> None:
    node = stack.nodes[0]
    directory = stack.local_dir(node, job, step)
    write_shards(directory, {"model.bin": 1000 + step})
    meta = {"loss": 1.0, "grad_norm": 2.0}
    await asyncio.to_thread(stack.client.register, job, step, directory, node, meta)
    await stack.wait_restorable(job, step, "lustre", WAIT)


async def _train(stack: Stack, job: str, step: int, values: list[list[object]]) -> tuple[int, str]:
    env = dict(os.environ) | {"TIERPOINT_API_URL": stack.api_url, "TIERPOINT_TOKEN": stack.token}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        TRAINING,
        job,
        str(step),
        json.dumps(values),
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), WAIT)
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace")


@pytest.mark.parametrize(
    ("values", "metric"),
    [
        ([[0.9, 2.0], ["NaN", 2.0]], "loss"),
        ([[0.9, 2.0], [0.9, "Infinity"]], "grad_norm"),
        ([[0.9, 2.0], [5.5, 2.0]], "loss"),  # over 5x the 1.0 recorded at save
    ],
)
async def test_a_diverging_step_marks_the_loaded_checkpoint_bad_and_exits(
    stack: Stack, values: list[list[object]], metric: str
) -> None:
    job = f"guard-{uuid.uuid4().hex[:8]}"
    await _checkpoint(stack, job, 10)
    await _checkpoint(stack, job, 20)
    code, out = await _train(stack, job, 20, values)
    assert code == GUARD_EXIT_CODE, out
    assert "marked" in out and "bad" in out and "trained on" not in out, out

    cp = await asyncio.to_thread(stack.client.checkpoint, job, 20)
    assert cp.health is not None and cp.health.verdict == "bad", cp
    assert (cp.health.metric, cp.health.at_step) == (metric, 22)
    bad = values[1][0 if metric == "loss" else 1]
    assert cp.health.value is not None
    assert math.isnan(cp.health.value) if bad == "NaN" else cp.health.value == float(bad)  # type: ignore[arg-type]
    assert cp.quarantine_reason
    # A restart does not load it again: latest walks back.
    latest = await asyncio.to_thread(stack.client.latest, job)
    assert latest is not None and latest.step == 10


async def test_healthy_steps_mark_the_loaded_checkpoint_good(stack: Stack) -> None:
    job = f"guard-{uuid.uuid4().hex[:8]}"
    await _checkpoint(stack, job, 10)
    await _checkpoint(stack, job, 20)
    assert await asyncio.to_thread(stack.client.latest, job, health="good") is None
    code, out = await _train(stack, job, 10, [[1.1, 2.5], [0.8, 1.9], [4.9, 9.9]])
    assert code == 0 and "trained on good" in out, out
    cp = await asyncio.to_thread(stack.client.checkpoint, job, 10)
    assert cp.health is not None and cp.health.verdict == "good" and not cp.quarantine_reason
    good = await asyncio.to_thread(stack.client.latest, job, health="good")
    assert good is not None and good.step == 10
