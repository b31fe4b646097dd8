"""A training job's purge of one of its old steps (a trainer's `rm -r tierpoint://<job>/step-N`):
its own `train:` token may ask for it, the checkpoint leaves "latest" and its copies go through
retention's expiry as an admin's deletion does, and what retention keeps stays: the job's newest
restorable checkpoint, a pinned or leased one."""

from __future__ import annotations

import httpx
from sqlalchemy import Engine

from tests.helpers.api import events, seed
from tests.helpers.tokens import as_token


async def test_a_job_purges_its_old_steps_never_its_newest_restorable(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    await seed(client, catalog, job, [2, 4, 6])
    trainer = as_token(catalog, f"train-{job}", [f"train:{job}"])
    r = await client.post(f"/v1/jobs/{job}/checkpoints/2/purge", headers=trainer)
    assert r.status_code == 202, r.text
    assert [d["step"] for d in r.json()["deleted"]] == [2]
    (deleted,) = events(catalog, "deleted", job=job)
    assert deleted["detail"]["force"] is False
    listed = await client.get(f"/v1/jobs/{job}/checkpoints", params={"state": "restorable"})
    assert [c["step"] for c in listed.json()["items"]] == [6, 4]

    refused = await client.post(f"/v1/jobs/{job}/checkpoints/6/purge", headers=trainer)
    assert refused.status_code == 409, refused.text
    assert refused.json()["code"] == "checkpoint_protected"
    assert refused.json()["protected"] == {"6": ["the job's newest restorable checkpoint"]}
    assert (await client.get(f"/v1/jobs/{job}/checkpoints/latest")).json()["step"] == 6

    assert (await client.put(f"/v1/jobs/{job}/checkpoints/4/pin")).status_code == 200
    pinned = await client.post(f"/v1/jobs/{job}/checkpoints/4/purge", headers=trainer)
    assert pinned.status_code == 409 and pinned.json()["protected"] == {"4": ["pinned"]}
    assert len(events(catalog, "deleted", job=job)) == 1


async def test_purging_needs_the_jobs_own_token(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    await seed(client, catalog, job, [1, 2], tiers=("ssd",))
    for scopes in (["train:someone-else-"], ["read", "operate"]):
        other = as_token(catalog, f"other-{job}", scopes)
        r = await client.post(f"/v1/jobs/{job}/checkpoints/1/purge", headers=other)
        assert r.status_code == 403 and r.json()["code"] == "insufficient_scope", r.text
    missing = await client.post(f"/v1/jobs/{job}/checkpoints/9/purge")
    assert missing.status_code == 404 and missing.json()["code"] == "checkpoint_not_found"
    assert events(catalog, "deleted", job=job) == []
