"""Lineage and forks as a user meets them: every checkpoint knows the one its run had loaded
(given, or the step before it on the timeline), across a rollback's branches and across jobs; a
fine-tune forked from a pre-training step restores the parent's copy where it is until it has a
restorable checkpoint of its own, and retention keeps that parent checkpoint until then; a fork
from a job the token cannot read, and a cycle, are refused without a change."""

from __future__ import annotations

import httpx
from sqlalchemy import Engine

from tests.helpers.api import counts, manifest, restorable, seed, shard
from tests.helpers.tokens import as_token

KEEP_ONE = {"format": 1, "kinds": {"shared": {"keep_last": 1}, "s3": {"keep_last": 1}}}


def _steps(items: list[dict[str, object]]) -> list[tuple[object, object, object]]:
    return [(i["job"], i["step"], i["branch"]) for i in items]


async def test_lineage_across_a_rollback_and_a_fork(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    await seed(client, catalog, job, [10, 20], tiers=("lustre",))
    assert (await client.post(f"/v1/jobs/{job}/rollback", json={"step": 10})).status_code == 201
    provenance = {"config_hash": "sha256:abc", "code_version": "git:1234", "data_cursor": [3, 7]}
    body = manifest(20, [shard("b2/0")]) | {"provenance": provenance}
    r = await client.post(f"/v1/jobs/{job}/checkpoints", json=body)
    assert r.status_code == 201, r.text
    assert r.json()["provenance"] == provenance
    restorable(catalog, job, 20, "lustre")

    child = f"{job}.sft"
    r = await client.post(f"/v1/jobs/{child}/fork", json={"parent": {"job": job, "step": 20}})
    assert r.status_code == 201, r.text
    assert (r.json()["parent"]["step"], r.json()["parent"]["branch"]) == (20, 2)
    again = await client.post(f"/v1/jobs/{child}/fork", json={"parent": {"job": job, "step": 20}})
    assert again.status_code == 200 and not again.json()["created"]

    # The child's first restore reads the parent's copy where it is.
    latest = (await client.get(f"/v1/jobs/{child}/checkpoints/latest")).json()
    assert (latest["job"], latest["step"], latest["fork_parent"]) == (job, 20, True)
    assert latest["checkpoint"]["branch"] == 2
    # Retention keeps it for the child, even past the parent's own rules.
    await seed(client, catalog, job, [30, 40], tiers=("lustre",))
    plan = await client.post(f"/v1/jobs/{job}/retention/plan", json={"policy": KEEP_ONE})
    keeps = {(k["step"], k["tier"]): k["reasons"] for k in plan.json()["plan"]["keeps"]}
    assert "fork_parent" in keeps[(20, "lustre")], plan.json()["plan"]

    # The child's first checkpoint descends from the fork's parent; its lineage runs back across
    # the job boundary and the branch point to the root.
    r = await client.post(f"/v1/jobs/{child}/checkpoints", json=manifest(100, [shard("c/0")]))
    assert r.status_code == 201, r.text
    assert r.json()["parent"]["job"] == job and r.json()["parent"]["step"] == 20
    lineage = (await client.get(f"/v1/jobs/{child}/checkpoints/100/lineage")).json()
    assert _steps(lineage["ancestors"]) == [(job, 20, 2), (job, 10, 1)]
    down = (await client.get(f"/v1/jobs/{job}/checkpoints/10/lineage")).json()
    assert set(_steps(down["descendants"])) >= {(job, 20, 1), (job, 20, 2), (child, 100, 1)}
    old = (await client.get(f"/v1/jobs/{job}/checkpoints/20/lineage", params={"branch": 1})).json()
    assert old["checkpoint"]["superseded"] is True and old["descendants"] == []

    # Once the child has a restorable checkpoint of its own, the parent's is the parent's again.
    restorable(catalog, child, 100, "lustre")
    plan = await client.post(f"/v1/jobs/{job}/retention/plan", json={"policy": KEEP_ONE})
    keeps = {(k["step"], k["tier"]): k["reasons"] for k in plan.json()["plan"]["keeps"]}
    assert "fork_parent" not in keeps.get((20, "lustre"), [])


async def test_bad_forks_and_parents_change_nothing(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    await seed(client, catalog, job, [10, 20], tiers=("lustre",))
    child = f"{job}-ft"
    assert (
        await client.post(f"/v1/jobs/{child}/fork", json={"parent": {"job": job, "step": 10}})
    ).status_code == 201
    await seed(client, catalog, child, [11], tiers=("lustre",))

    # A token that may write the child but not read the parent.
    other = f"other-{job}"
    await seed(client, catalog, other, [5], tiers=("lustre",))
    before = counts(catalog)
    narrow = as_token(catalog, "narrow", [f"train:{job}"])
    r = await client.post(
        f"/v1/jobs/{job}-x/fork", json={"parent": {"job": other, "step": 5}}, headers=narrow
    )
    assert (r.status_code, r.json()["code"]) == (403, "insufficient_scope")
    cases = [
        (job, {"parent": {"job": child, "step": 11}}, 422, "lineage_cycle"),  # own descendant
        (job, {"parent": {"job": job, "step": 10}}, 422, "lineage_cycle"),  # itself
        (child, {"parent": {"job": job, "step": 20}}, 409, "job_exists"),  # another parent
        (f"{job}-y", {"parent": {"job": job, "step": 15}}, 404, "checkpoint_not_found"),
        (f"{job}-y", {"parent": {"job": "nope", "step": 1}}, 404, "job_not_found"),
        (f"{job}-y", {"parent": {"job": job}}, 422, "validation_error"),
    ]
    for target, body, status, code in cases:
        r = await client.post(f"/v1/jobs/{target}/fork", json=body)
        assert (r.status_code, r.json()["code"]) == (status, code), (body, r.text)
    # A registration naming a parent that does not exist, or a later step of its own job.
    for parent, code in (
        ({"job": job, "step": 11}, "unknown_parent"),
        ({"job": job, "step": 20}, "lineage_cycle"),
    ):
        body = manifest(15, [shard("p/0")]) | {"parent": parent}
        r = await client.post(f"/v1/jobs/{job}/checkpoints", json=body)
        assert (r.status_code, r.json()["code"]) == (422, code), r.text
    assert counts(catalog) == before
