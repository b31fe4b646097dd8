"""Health verdicts as a training loop's guard meets them: a checkpoint marked bad after a NaN is
quarantined with the verdict as its evidence, so a restarting job never loads it again (no
restart loop); `latest?health=good` walks back across tiers and branches to the newest
checkpoint certified good; bad is final; retention never expires the newest good checkpoint;
a token of another job's scope cannot give a verdict."""

from __future__ import annotations

from typing import Any

import httpx
from sqlalchemy import Engine

from tests.helpers.api import counts, events, restorable, seed
from tests.helpers.tokens import as_token

NAN = {"verdict": "bad", "metric": "loss", "value": "NaN", "at_step": 33, "detail": "after load"}


async def _latest(client: httpx.AsyncClient, job: str, **params: Any) -> httpx.Response:
    return await client.get(f"/v1/jobs/{job}/checkpoints/latest", params=params)


async def test_bad_quarantines_and_latest_good_walks_back(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    await seed(client, catalog, job, [10, 20, 30], tiers=("lustre", "s3"))
    guard = as_token(catalog, f"guard-{job}", [f"train:{job}"])
    url = f"/v1/jobs/{job}/checkpoints/{{}}/verdict"

    # Nothing certified yet: no known-good latest, and the answer says why for each step.
    r = await _latest(client, job, health="good")
    assert (r.status_code, r.json()["code"]) == (404, "no_restorable_checkpoint")
    assert r.json()["skipped"][0]["reasons"][0] == "health: no verdict"

    for step in (10, 20):
        r = await client.put(
            url.format(step),
            json={"verdict": "good", "metric": "loss", "value": 2.0},
            headers=guard,
        )
        assert r.status_code == 200, r.text
        assert r.json()["health"]["verdict"] == "good"
        assert r.json()["health"]["by"] == f"guard-{job}"

    # The guard sees NaN right after loading step 30: bad, quarantined, never latest again.
    r = await client.put(url.format(30), json=NAN, headers=guard)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["health"]["verdict"] == "bad" and body["health"]["value"] == "NaN"
    assert body["quarantine_reason"] == "verdict bad: loss=NaN at step 33 (after load)"
    latest = (await _latest(client, job)).json()
    assert latest["step"] == 20
    assert latest["skipped"][0]["reasons"] == [f"quarantined: {body['quarantine_reason']}"]
    good = (await _latest(client, job, health="good")).json()
    assert good["step"] == 20 and good["checkpoint"]["health"]["verdict"] == "good"

    # A checkpoint without a verdict above the good one: plain latest takes it, good does not.
    await seed(client, catalog, job, [40], tiers=("lustre",))
    assert (await _latest(client, job)).json()["step"] == 40
    good = (await _latest(client, job, health="good")).json()
    assert good["step"] == 20
    assert good["skipped"][0] == {"step": 40, "reasons": ["health: no verdict"]}

    # Suspect keeps a checkpoint out of the known-good answer only.
    r = await client.put(url.format(20), json={"verdict": "suspect"}, headers=guard)
    assert r.status_code == 200 and r.json()["health"]["verdict"] == "suspect"
    assert (await _latest(client, job, health="good")).json()["step"] == 10

    # The same verdict again changes nothing; bad is final.
    before = counts(catalog), len(events(catalog, "verdict", job=job))
    again = await client.put(url.format(30), json={**NAN, "detail": "again"}, headers=guard)
    assert again.status_code == 200 and again.json()["health"]["detail"] == "after load"
    r = await client.put(url.format(30), json={"verdict": "good"}, headers=guard)
    assert (r.status_code, r.json()["code"]) == (409, "verdict_conflict")
    assert (counts(catalog), len(events(catalog, "verdict", job=job))) == before

    # The verdict is kept as evidence: retention's dry run keeps it, and the newest good one.
    restorable(catalog, job, 10, "ssd", local=True)
    plan = await client.post(
        f"/v1/jobs/{job}/retention/plan",
        json={
            "policy": {
                "format": 1,
                "kinds": {
                    "shared": {"keep_last": 1},
                    "s3": {"keep_last": 1},
                    "local": {"keep_last": 1},
                },
            }
        },
    )
    assert plan.status_code == 200, plan.text
    keeps = {(k["step"], k["tier"]): set(k["reasons"]) for k in plan.json()["plan"]["keeps"]}
    assert "quarantined" in keeps[(30, "lustre")]
    assert "newest_good" in keeps[(10, "lustre")] and "newest_good" in keeps[(10, "ssd")]


async def test_bad_verdicts_change_nothing(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    await seed(client, catalog, job, [10], tiers=("lustre",))
    before = counts(catalog)
    url = f"/v1/jobs/{job}/checkpoints/10/verdict"
    stranger = as_token(catalog, "stranger", ["train:someone-else-"])
    r = await client.put(url, json={"verdict": "bad"}, headers=stranger)
    assert (r.status_code, r.json()["code"]) == (403, "insufficient_scope")
    reader = as_token(catalog, "reader", ["read"])
    r = await client.put(url, json={"verdict": "good"}, headers=reader)
    assert (r.status_code, r.json()["code"]) == (403, "insufficient_scope")
    for body in (
        {"verdict": "great"},
        {"verdict": "good", "metric": ""},
        {"verdict": "good", "x": 1},
    ):
        r = await client.put(url, json=body)
        assert (r.status_code, r.json()["code"]) == (422, "validation_error"), body
    r = await client.put(f"/v1/jobs/{job}/checkpoints/11/verdict", json={"verdict": "good"})
    assert (r.status_code, r.json()["code"]) == (404, "checkpoint_not_found")
    r = await client.put(url, params={"branch": 2}, json={"verdict": "good"})
    assert (r.status_code, r.json()["code"]) == (404, "checkpoint_not_found")
    assert counts(catalog) == before
