"""What a load by URL costs the API: the same at any world size, as TierpointReader's. A trainer's
resume by URL as torchtitan makes it (every rank probes the folder, lists it, probes each step
folder, then `dcp.load`s the step it found), ranks of real processes on the real stack, the
requests counted by the server."""

from __future__ import annotations

from pathlib import Path

from tests.client.torch.ranks import new_job, wait_everywhere
from tests.client.torch.test_dcp import api_requests
from tests.client.torch.test_fsspec_dcp import ok, url_ranks
from tests.helpers.client import Stack

# The coordinator's probes of a job with two steps (existence, folder, listing; two probes per
# step folder; the chosen step's folder), one restore started and its lease released.
RESUME_REQUESTS = 10


async def test_a_resume_by_url_costs_the_same_requests_with_one_rank_and_two(
    stack: Stack, tmp_path: Path
) -> None:
    job = new_job("url")
    for step in (2, 4):
        url = f"tierpoint://{job}/step-{step}"
        ok(await url_ranks(stack, tmp_path, "save", url, step, world=2))
        await wait_everywhere(stack, job, step, ("ssd",))
    counts = {}
    for world in (1, 2):
        before = await api_requests(stack)
        reports = await url_ranks(stack, tmp_path, "resume", f"tierpoint://{job}", 4, world=world)
        ok(reports)
        assert [r["resumed"] for r in reports] == [4] * world, reports
        counts[world] = await api_requests(stack) - before
    assert counts == {1: RESUME_REQUESTS, 2: RESUME_REQUESTS}
