"""Rolling back a run, as a training job meets it: a step saved once cannot be saved again,
until a rollback starts a new branch from an earlier step. Then the steps after it are saved
again on the new branch, `latest` follows it, the old branch's checkpoints are superseded (still
listed, restorable by branch), a retried rollback answers the same branch, and two racing
rollbacks leave one winner and a clear 409 naming it."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from sqlalchemy import Engine, text

from tests.helpers.api import counts, manifest, restorable, seed, shard
from tests.helpers.tokens import as_token


def _branches(catalog: Engine, job: str) -> list[tuple[int, int | None, int | None]]:
    with catalog.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT b.number, b.parent, b.from_step FROM branch b "
                "JOIN job j ON j.id = b.job_id "
                "WHERE j.name = :job ORDER BY b.number"
            ),
            {"job": job},
        )
        return [(r[0], r[1], r[2]) for r in rows]


async def _latest(client: httpx.AsyncClient, job: str, **params: Any) -> dict[str, Any]:
    r = await client.get(f"/v1/jobs/{job}/checkpoints/latest", params=params)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


async def test_roll_back_and_save_the_steps_again(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    await seed(client, catalog, job, [10, 20, 30], tiers=("lustre",))
    trainer = as_token(catalog, f"train-{job}", [f"train:{job}"])
    resave = manifest(20, [shard("again/0", size=7)], loss=1.5)

    # What a new user meets first: a step is saved once.
    r = await client.post(f"/v1/jobs/{job}/checkpoints", json=resave, headers=trainer)
    assert r.status_code == 409 and r.json()["code"] == "checkpoint_conflict"

    r = await client.post(
        f"/v1/jobs/{job}/rollback",
        json={"step": 10, "from_branch": 1, "reason": "loss spike"},
        headers=trainer,
    )
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["created"] and body["superseded"] == [20, 30]
    assert body["branch"]["number"] == 2 and body["branch"]["parent"] == 1
    assert body["branch"]["from_step"] == 10 and body["branch"]["step_dir"] == "{step}.b2"
    assert body["branch"]["created_by"] == f"train-{job}" and body["branch"]["current"]

    # Latest follows the new branch, which holds step 10 from the old one.
    latest = await _latest(client, job)
    assert latest["step"] == 10 and latest["checkpoint"]["branch"] == 1
    assert latest["skipped"] == []
    # The old branch's own timeline still answers its newest.
    old = await _latest(client, job, branch=1)
    assert old["step"] == 30 and old["checkpoint"]["superseded_by"] == 2

    # A retried rollback: the same branch, nothing new.
    again = await client.post(
        f"/v1/jobs/{job}/rollback", json={"step": 10, "from_branch": 1}, headers=trainer
    )
    assert again.status_code == 200, again.text
    assert not again.json()["created"] and again.json()["branch"]["number"] == 2
    assert again.json()["superseded"] == []

    # The step is saved again, on the new branch, as a child of the step it went back to.
    r = await client.post(f"/v1/jobs/{job}/checkpoints", json=resave, headers=trainer)
    assert r.status_code == 201, r.text
    assert r.json()["branch"] == 2 and r.json()["superseded_by"] is None
    assert r.json()["parent"]["step"] == 10 and r.json()["parent"]["branch"] == 1
    restorable(catalog, job, 20, "lustre")
    latest = await _latest(client, job)
    assert latest["step"] == 20 and latest["checkpoint"]["branch"] == 2
    assert latest["checkpoint"]["metadata"] == {"loss": 1.5}

    # Both step-20 checkpoints are listed; a step names the timeline's, ?branch= the other.
    listed = (await client.get(f"/v1/jobs/{job}/checkpoints")).json()["items"]
    assert [(c["step"], c["branch"], c["superseded_by"]) for c in listed] == [
        (30, 1, 2),
        (20, 2, None),
        (20, 1, 2),
        (10, 1, None),
    ]
    one = (await client.get(f"/v1/jobs/{job}/checkpoints/20")).json()
    assert one["branch"] == 2
    left = (await client.get(f"/v1/jobs/{job}/checkpoints/20", params={"branch": 1})).json()
    assert left["branch"] == 1 and left["superseded_by"] == 2

    branches = (await client.get(f"/v1/jobs/{job}/branches")).json()
    assert branches["current"] == 2
    assert [(b["number"], b["from_step"], b["current"]) for b in branches["items"]] == [
        (1, None, False),
        (2, 10, True),
    ]

    # A writer still running on the branch a rollback left cannot add to it.
    stale = manifest(40, [shard("late/0")])
    stale["branch"] = 1
    r = await client.post(f"/v1/jobs/{job}/checkpoints", json=stale, headers=trainer)
    assert r.status_code == 409 and r.json()["code"] == "branch_superseded"
    assert r.json()["current_branch"] == 2


async def test_a_second_rollback_to_the_same_step_after_saving_again_goes_back_again(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    """A run rolls back to step 10, trains on and saves step 20 again, spikes again and rolls
    back to step 10 once more. That is a new rollback, not a retry of the first: it supersedes
    the new step 20 and latest answers step 10 (it was taken for a retry, answered 200 with the
    old branch, and the job restarted from the step it meant to leave)."""
    await seed(client, catalog, job, [10, 20], tiers=("lustre",))
    trainer = as_token(catalog, f"train-{job}", [f"train:{job}"])
    first = await client.post(f"/v1/jobs/{job}/rollback", json={"step": 10}, headers=trainer)
    assert first.status_code == 201 and first.json()["superseded"] == [20], first.text
    r = await client.post(
        f"/v1/jobs/{job}/checkpoints", json=manifest(20, [shard("again/0")]), headers=trainer
    )
    assert r.status_code == 201 and r.json()["branch"] == 2, r.text
    restorable(catalog, job, 20, "lustre")

    # A request of the first rollback arriving late, naming the branch it left: refused.
    late = await client.post(
        f"/v1/jobs/{job}/rollback", json={"step": 10, "from_branch": 1}, headers=trainer
    )
    assert (late.status_code, late.json()["code"]) == (409, "rollback_conflict"), late.text

    again = await client.post(f"/v1/jobs/{job}/rollback", json={"step": 10}, headers=trainer)
    assert again.status_code == 201, again.text
    assert again.json()["created"] and again.json()["branch"]["number"] == 3
    assert again.json()["branch"]["parent"] == 2 and again.json()["superseded"] == [20]
    latest = await _latest(client, job)
    assert (latest["step"], latest["checkpoint"]["branch"]) == (10, 1)
    assert _branches(catalog, job) == [(1, None, None), (2, 1, 10), (3, 2, 10)]


async def test_racing_rollbacks_one_wins_the_other_is_told_who(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    await seed(client, catalog, job, [10, 20, 30, 40], tiers=("lustre",))
    alice = as_token(catalog, "alice", [f"train:{job}"])
    bob = as_token(catalog, "bob", [f"train:{job}"])

    async def roll(step: int, who: dict[str, str]) -> httpx.Response:
        return await client.post(
            f"/v1/jobs/{job}/rollback", json={"step": step, "from_branch": 1}, headers=who
        )

    a, b = await asyncio.gather(roll(10, alice), roll(20, bob))
    assert sorted([a.status_code, b.status_code]) == [201, 409], (a.text, b.text)
    won, lost = (a, b) if a.status_code == 201 else (b, a)
    assert lost.json()["code"] == "rollback_conflict"
    assert lost.json()["winner"]["number"] == 2
    assert lost.json()["winner"]["created_by"] == won.json()["branch"]["created_by"]
    assert _branches(catalog, job) == [(1, None, None), (2, 1, won.json()["branch"]["from_step"])]

    # The same target by another caller while the winner's branch is current: also refused.
    step = won.json()["branch"]["from_step"]
    other = bob if won is a else alice
    r = await client.post(f"/v1/jobs/{job}/rollback", json={"step": step}, headers=other)
    assert r.status_code == 409 and r.json()["code"] == "rollback_conflict"


async def test_bad_rollbacks_change_nothing(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    await seed(client, catalog, job, [10, 20, 30], tiers=("lustre",))
    pending = await client.post(f"/v1/jobs/{job}/checkpoints", json=manifest(40, [shard("p")]))
    assert pending.status_code == 201
    ok = await client.post(f"/v1/jobs/{job}/rollback", json={"step": 20})
    assert ok.status_code == 201
    before = counts(catalog), _branches(catalog, job)

    cases = [
        ({"step": 15}, 404, "checkpoint_not_found"),  # no such step
        ({"step": 99}, 422, "rollback_to_future"),  # after the timeline's newest
        ({"step": 30}, 409, "checkpoint_superseded"),  # left by the rollback to 20
        ({"step": -1}, 422, "validation_error"),
        ({"step": 10, "from_branch": 0}, 422, "validation_error"),
        ({"step": 10, "extra": 1}, 422, "validation_error"),
    ]
    for body, status, code in cases:
        r = await client.post(f"/v1/jobs/{job}/rollback", json=body)
        assert (r.status_code, r.json()["code"]) == (status, code), (body, r.text)
        assert r.headers["content-type"].startswith("application/problem+json")
    r = await client.post("/v1/jobs/no-such-job/rollback", json={"step": 1})
    assert (r.status_code, r.json()["code"]) == (404, "job_not_found")
    assert (counts(catalog), _branches(catalog, job)) == before

    # Step 40 of branch 1 was superseded before it was ever restorable; a step registered on
    # branch 2 and not yet copied anywhere cannot be gone back to.
    r = await client.post(f"/v1/jobs/{job}/checkpoints", json=manifest(25, [shard("q")]))
    assert r.status_code == 201 and r.json()["branch"] == 2
    before = counts(catalog), _branches(catalog, job)
    r = await client.post(f"/v1/jobs/{job}/rollback", json={"step": 25})
    assert (r.status_code, r.json()["code"]) == (409, "not_restorable"), r.text
    assert "no tier holds a restorable copy" in r.json()["detail"]
    assert (counts(catalog), _branches(catalog, job)) == before

    # A token of another job's scope may not roll this one back.
    stranger = as_token(catalog, "stranger", ["train:other-"])
    r = await client.post(f"/v1/jobs/{job}/rollback", json={"step": 10}, headers=stranger)
    assert (r.status_code, r.json()["code"]) == (403, "insufficient_scope")
    assert (counts(catalog), _branches(catalog, job)) == before
