"""What a `dcp.load` waits for from the API before its reads: the one request that starts it
(the step, the lease, every copy), and no round trip after it. The job's branches (which branch
the run then saves on) are asked for beside that request, not after `.metadata` was read.

A proxy in front of the real API holds the load's start: the branches request must reach the API
while the start is still held, from a real rank process reading a real checkpoint."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.client.torch.ranks import (
    assert_loaded,
    new_job,
    ranks,
    run_ranks,
    wait_everywhere,
)
from tests.helpers.client import Stack
from tests.helpers.hold_proxy import hold_proxy

# A hang guard only: a rank asks for the branches within milliseconds of the start, or (one
# after the other) never while the other is held.
BESIDE = 60.0


async def test_a_load_asks_for_the_branches_beside_its_start(stack: Stack, tmp_path: Path) -> None:
    job, step = new_job(), 4
    await ranks(stack, tmp_path, "save", job, world=1, step=step)
    await wait_everywhere(stack, job, step, tiers=("ssd",))

    # Both held: only requests sent beside each other are ever held at once, whichever of the
    # two reaches the proxy first.
    with hold_proxy(stack.api_url, ("/restores", "/branches")) as proxy:
        load = asyncio.create_task(
            run_ranks(
                stack, tmp_path, "load", job, world=1, step=step, tier="ssd", api_url=proxy.url
            )
        )
        try:
            async with asyncio.timeout(BESIDE):
                while proxy.held() < 2:  # noqa: ASYNC110
                    await asyncio.sleep(0.05)
            assert sorted(map(_named, proxy.seen)) == ["branches", "restores"], proxy.seen
        finally:
            proxy.release()
        loaded = (await load).reports

    assert_loaded(loaded, step)
    assert [r["lease_released"] for r in loaded] == [True]
    # The load's requests: its start, the branches, the lease's release; nothing else.
    assert sorted(map(_named, proxy.seen)) == ["branches", "leases", "restores"], proxy.seen


def _named(target: str) -> str:
    """What a request's target names: `restores`, `branches`, `leases` (a lease's release)."""
    parts = target.split("?")[0].rstrip("/").split("/")
    return parts[-2] if parts[-2] == "leases" else parts[-1]
