"""After a rollback a step may be two checkpoints: the superseded one and the one saved again.
Every route that acts on one checkpoint of a step takes `?branch=` and acts on that one only,
never on the other: a restore (and its lease), the cached copies a load records, a pin, a
quarantine, the events, a purge. Without it, a step names the one on the job's timeline."""

from __future__ import annotations

from typing import Any

import httpx
from sqlalchemy import Engine

from tests.helpers.api import NODE_B, manifest, restorable, seed, shard
from tests.helpers.tokens import as_token

NEWEST = "the job's newest restorable checkpoint"


async def _checkpoint(client: httpx.AsyncClient, job: str, branch: int) -> dict[str, Any]:
    r = await client.get(f"/v1/jobs/{job}/checkpoints/20", params={"branch": branch})
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


async def _saved_again(client: httpx.AsyncClient, catalog: Engine, job: str) -> None:
    """Steps 10, 20 and 30 on every tier, a rollback to 10, and 20 saved again on branch 2."""
    await seed(client, catalog, job, [10, 20, 30])
    r = await client.post(f"/v1/jobs/{job}/rollback", json={"step": 10, "from_branch": 1})
    assert r.status_code == 201, r.text
    again = manifest(20, [shard("again/0", size=7)]) | {"branch": 2}
    r = await client.post(f"/v1/jobs/{job}/checkpoints", json=again)
    assert r.status_code == 201, r.text
    for tier in ("ssd", "lustre", "s3"):  # the timeline's step 20: branch 2's
        restorable(catalog, job, 20, tier, local=tier == "ssd")


async def test_a_restore_and_its_lease_name_the_checkpoint_of_their_branch(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    await _saved_again(client, catalog, job)
    url = f"/v1/jobs/{job}/restores"
    r = await client.post(url, json={"ttl_seconds": 600, "step": 20, "branch": 1})
    assert r.status_code == 201, r.text
    old = r.json()
    assert (old["job"], old["step"], old["branch"]) == (job, 20, 1), old
    assert old["checkpoint"]["superseded_by"] == 2
    assert [s["path"] for s in old["checkpoint"]["shards"]] == ["s20/0", "s20/1"]
    r = await client.post(url, json={"ttl_seconds": 600, "step": 20})
    assert r.status_code == 201 and r.json()["branch"] == 2, r.text
    # The newest of branch 1's own timeline, as `latest?branch=1` answers it.
    r = await client.post(url, json={"ttl_seconds": 600, "branch": 1})
    assert r.status_code == 201 and (r.json()["step"], r.json()["branch"]) == (30, 1), r.text
    newest_of_one = r.json()["lease"]["id"]
    r = await client.post(url, json={"ttl_seconds": 600, "health": "good"})
    assert r.status_code == 404 and r.json()["code"] == "no_restorable_checkpoint", r.text
    r = await client.post(url, json={"ttl_seconds": 600, "step": 20, "health": "good"})
    assert r.status_code == 422 and r.json()["code"] == "validation_error", r.text

    leases = f"/v1/jobs/{job}/checkpoints/20/leases"
    held = (await client.get(leases, params={"branch": 1})).json()["items"]
    assert [x["id"] for x in held] == [old["lease"]["id"]], held
    timeline = (await client.get(leases)).json()["items"]
    assert len(timeline) == 1 and timeline[0]["id"] != old["lease"]["id"], timeline
    r = await client.get(f"/v1/jobs/{job}/checkpoints/30/leases")
    assert [x["id"] for x in r.json()["items"]] == [newest_of_one], r.text


async def test_cached_copies_pins_and_purges_act_on_the_checkpoint_of_their_branch(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    await _saved_again(client, catalog, job)
    cached = f"/v1/jobs/{job}/checkpoints/20/cached-copies"
    # node-b keeps a copy of a file of node-a's.
    body = {"tier": "ssd", "copies": [{"node": NODE_B, "paths": ["s20/0"]}]}
    r = await client.post(cached, json=body, params={"branch": 1})
    assert r.status_code == 200, r.text
    assert r.json()["copies"] == [{"node": NODE_B, "paths": ["s20/0"]}]
    # The timeline's step 20 has no such file.
    r = await client.post(cached, json=body)
    assert r.status_code == 422 and r.json()["code"] == "validation_error", r.text

    pin = f"/v1/jobs/{job}/checkpoints/20/pin"
    r = await client.put(pin, params={"branch": 1})
    assert r.status_code == 200, r.text
    assert (await _checkpoint(client, job, 1))["pinned"] is True
    assert (await _checkpoint(client, job, 2))["pinned"] is False
    r = await client.delete(pin, params={"branch": 1})
    assert r.status_code == 200 and not (await _checkpoint(client, job, 1))["pinned"]

    quarantine = f"/v1/jobs/{job}/checkpoints/20/quarantine"
    r = await client.post(quarantine, params={"branch": 1}, json={"reason": "diverged"})
    assert r.status_code == 200 and r.json()["branch"] == 1, r.text
    assert (await _checkpoint(client, job, 1))["quarantine_reason"] == "diverged"
    assert (await _checkpoint(client, job, 2))["quarantine_reason"] is None
    events = f"/v1/jobs/{job}/checkpoints/20/events"
    kinds = [e["kind"] for e in (await client.get(events, params={"branch": 1})).json()["items"]]
    assert "quarantined" in kinds and "pinned" in kinds, kinds
    kinds = [e["kind"] for e in (await client.get(events)).json()["items"]]
    assert "quarantined" not in kinds and "pinned" not in kinds, kinds
    r = await client.delete(quarantine, params={"branch": 1})
    assert r.status_code == 200 and r.json()["quarantine_reason"] is None, r.text

    # The job's own token purges the superseded one; the one saved again stays. The job's newest
    # restorable checkpoint, which a purge never deletes, is the timeline's: the re-saved 20,
    # not the superseded 30.
    trainer = as_token(catalog, f"train-{job}", [f"train:{job}"])
    purge = f"/v1/jobs/{job}/checkpoints/20/purge"
    r = await client.post(purge, params={"branch": 1}, headers=trainer)
    assert r.status_code == 202, r.text
    assert (await _checkpoint(client, job, 1))["deleted_at"] is not None
    assert (await _checkpoint(client, job, 2))["deleted_at"] is None
    r = await client.post(f"/v1/jobs/{job}/checkpoints/30/purge", headers=trainer)
    assert r.status_code == 202, r.text
    r = await client.post(purge, headers=trainer)
    assert r.status_code == 409 and r.json()["protected"] == {"20": [NEWEST]}, r.text
