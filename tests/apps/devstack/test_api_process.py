"""`tierpoint dev` runs its API in a process of its own, as production does: a registration is
answered while the process of every node's worker cannot run at all (here: SIGSTOPped, the
extreme of workers whose threads hold the GIL through a storm of checkpoints), and the lifecycle
takes the checkpoint over once the workers run again. SIGKILL of the stack takes its API down
with it (tests/apps/devstack/test_dev_killed.py). Real processes, real signals."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import crc32c
import pytest

from tests.apps.devstack.test_dev_stack_e2e import DevProcess, _tail, start_dev

# Starts processes itself (derivation sees only fixtures): tests/helpers/tiers.py.
pytestmark = [pytest.mark.slow, pytest.mark.full_stack]

RESTORABLE_TIMEOUT = 180.0  # a hang guard


@pytest.fixture
def dev() -> Iterator[DevProcess]:
    root = Path(tempfile.mkdtemp(prefix="tierpoint-api-process-"))
    root.chmod(0o755)  # the embedded Postgres runs as its own user when we are root
    stack = start_dev(root / "dev", root / "dev.log")
    try:
        yield stack
    finally:
        os.kill(stack.proc.pid, signal.SIGCONT)
        assert stack.interrupt() == 0, _tail(stack.log)
        shutil.rmtree(root, ignore_errors=True)


def test_a_registration_is_answered_while_the_workers_process_is_stopped(dev: DevProcess) -> None:
    node, local = next(iter(dev.info.nodes.items()))
    job, step = f"api-process-{uuid.uuid4().hex[:6]}", 1
    data = os.urandom(64 * 1024)
    shard = Path(local) / job / str(step) / "rank-0.bin"
    shard.parent.mkdir(parents=True)
    shard.write_bytes(data)
    body = {
        "step": step,
        "shards": [
            {"path": "rank-0.bin", "size": len(data), "crc32c": f"{crc32c.crc32c(data):08x}"}
            | {"node": node}
        ],
    }

    os.kill(dev.proc.pid, signal.SIGSTOP)
    try:
        with dev.api() as api:  # its timeout is 30 s: an API in the stopped process never answers
            resp = api.post(f"/v1/jobs/{job}/checkpoints", json=body)
            assert resp.status_code == 201, resp.text
            assert resp.json()["step"] == step
            listed = api.get(f"/v1/jobs/{job}/checkpoints/{step}")
            assert listed.status_code == 200, listed.text
    finally:
        os.kill(dev.proc.pid, signal.SIGCONT)

    # The workers run again: the lifecycle that the API started takes the checkpoint to S3.
    deadline = time.monotonic() + RESTORABLE_TIMEOUT
    with dev.api() as api:
        while True:
            tiers = {
                t["tier"]: t["state"]
                for t in api.get(f"/v1/jobs/{job}/checkpoints/{step}").json()["tiers"]
            }
            if tiers.get("s3") == "restorable":
                break
            assert time.monotonic() < deadline, (tiers, _tail(dev.log))
            time.sleep(0.5)
    assert set(tiers.values()) == {"restorable"}, tiers
