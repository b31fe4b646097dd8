"""Quarantine of a checkpoint or of one tier's copy: latest restorable walks back to the next best
and says why, the change is an event with its actor, doing it again changes nothing, lifting it
makes the copy restorable again, and retention never expires a copy an operator quarantined; a
training job's quarantine hides the checkpoint but leaves its copies to the job's policy."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from tests.helpers.api import row_counts, seed, set_marker, set_replicas
from tests.helpers.tokens import TEST_ADMIN, actor_name, as_token
from tierpoint.catalog.tier_copy.expiry import begin_expiry
from tierpoint.config import Settings
from tierpoint.contract.retention import BeginState
from tierpoint.retention import tier_refs

NAN = "loss is NaN right after loading"


def _events(catalog: Engine, job: str) -> list[tuple[str, str | None, str | None, dict[str, Any]]]:
    with catalog.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT e.kind, e.tier, e.actor, e.detail FROM event e "
                "JOIN job j ON j.id = e.job_id WHERE j.name = :job "
                "AND e.kind IN ('quarantined', 'quarantine_lifted') "
                "ORDER BY e.id"
            ),
            {"job": job},
        )
        return [(r.kind, r.tier, actor_name(r.actor), r.detail) for r in rows]


def _tier(body: dict[str, Any], name: str) -> dict[str, Any]:
    return next(t for t in body["tiers"] if t["tier"] == name)


async def _latest(client: httpx.AsyncClient, job: str, **params: str) -> dict[str, Any]:
    r = await client.get(f"/v1/jobs/{job}/checkpoints/latest", params=params)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


async def test_quarantined_checkpoint_walks_back_and_lifts(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    await seed(client, catalog, job, [100, 200], tiers=("lustre", "s3"))
    assert (await _latest(client, job))["step"] == 200
    url = f"/v1/jobs/{job}/checkpoints/200/quarantine"
    alice = as_token(catalog, "alice", ["operate"])

    r = await client.post(url, json={"reason": NAN}, headers=alice)
    assert r.status_code == 200, r.text
    assert r.json()["step"] == 200 and r.json()["quarantine_reason"] == NAN
    latest = await _latest(client, job)
    assert latest["step"] == 100
    assert latest["skipped"] == [{"step": 200, "reasons": [f"quarantined: {NAN}"]}]
    # Nothing a lease could hold: quarantined checkpoints are not restored from.
    lease = await client.post(f"/v1/jobs/{job}/checkpoints/200/leases", json={"ttl_seconds": 60})
    assert lease.status_code == 409 and lease.json()["code"] == "not_leasable"

    # Again: same answer, no second event.
    again = await client.post(url, json={"reason": NAN}, headers=alice)
    assert again.status_code == 200 and again.json() == r.json()
    assert _events(catalog, job) == [
        ("quarantined", None, "alice", {"step": 200, "reason": NAN, "evidence": True})
    ]

    lifted = await client.delete(url, headers=alice)
    assert lifted.status_code == 200, lifted.text
    assert lifted.json()["quarantine_reason"] is None
    assert (await client.delete(url)).json() == lifted.json()
    assert (await _latest(client, job))["step"] == 200
    assert _events(catalog, job)[1:] == [
        ("quarantine_lifted", None, "alice", {"step": 200, "previous_reason": NAN})
    ]


async def test_quarantined_tier_copy_serves_the_next_tier(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    await seed(client, catalog, job, [100, 200], tiers=("lustre", "s3"))
    url = f"/v1/jobs/{job}/checkpoints/200/quarantine"
    r = await client.post(url, json={"reason": "crc mismatch on load", "tier": "lustre"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["quarantine_reason"] is None
    assert _tier(body, "lustre")["quarantine_reason"] == "crc mismatch on load"
    assert _tier(body, "s3")["quarantine_reason"] is None

    # Still step 200, now from s3; restricted to lustre it walks back and says why.
    latest = await _latest(client, job)
    assert latest["step"] == 200 and {e["tier"] for e in latest["plan"]} == {"s3"}
    on_lustre = await _latest(client, job, tier="lustre")
    assert on_lustre["step"] == 100
    assert on_lustre["skipped"] == [
        {"step": 200, "reasons": ["lustre: quarantined: crc mismatch on load"]}
    ]
    assert _events(catalog, job) == [
        (
            "quarantined",
            "lustre",
            TEST_ADMIN,
            {"step": 200, "reason": "crc mismatch on load", "evidence": True},
        )
    ]

    lifted = await client.delete(url, params={"tier": "lustre"})
    assert lifted.status_code == 200 and _tier(lifted.json(), "lustre")["quarantine_reason"] is None
    assert (await _latest(client, job, tier="lustre"))["step"] == 200


async def test_refusals_change_nothing(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    await seed(client, catalog, job, [100], tiers=("lustre", "s3"))
    set_marker(catalog, job, 100, "lustre", "expiring")
    before = row_counts(catalog)
    url = f"/v1/jobs/{job}/checkpoints/100/quarantine"
    cases: list[tuple[httpx.Response, int, str]] = [
        (await client.post(url, json={"reason": "x", "tier": "lustre"}), 409, "copy_expiring"),
        (await client.post(url, json={"reason": "x", "tier": "nvme"}), 422, "unknown_tier"),
        (await client.delete(url, params={"tier": "nvme"}), 422, "unknown_tier"),
        (await client.post(url, json={"reason": ""}), 422, "validation_error"),
        (await client.post(url, json={"reason": "x" * 1025}), 422, "validation_error"),
        (await client.post(url, json={"reason": "a\nb"}), 422, "validation_error"),
        (await client.post(url, json={"reason": "x", "extra": 1}), 422, "validation_error"),
        (await client.post(url, json={}), 422, "validation_error"),
        (
            await client.post(f"/v1/jobs/{job}/checkpoints/7/quarantine", json={"reason": "x"}),
            404,
            "checkpoint_not_found",
        ),
        (
            await client.post(f"/v1/jobs/{job}/checkpoints/-1/quarantine", json={"reason": "x"}),
            422,
            "validation_error",
        ),
        (
            await client.post(
                f"/v1/jobs/{job}/checkpoints/{2**63}/quarantine", json={"reason": "x"}
            ),
            422,
            "step_out_of_range",
        ),
        (
            await client.post("/v1/jobs/..x/checkpoints/1/quarantine", json={"reason": "x"}),
            422,
            "invalid_job_name",
        ),
    ]
    for r, status, code in cases:
        assert (r.status_code, r.json()["code"]) == (status, code), r.text
        assert r.headers["content-type"] == "application/problem+json"
    assert row_counts(catalog) == before
    with catalog.connect() as conn:
        reasons = conn.execute(
            text(
                "SELECT count(*) FROM checkpoint_tier t JOIN job j ON j.id = t.job_id "
                "WHERE j.name = :job AND t.quarantine_reason IS NOT NULL"
            ),
            {"job": job},
        ).scalar_one()
    assert reasons == 0


async def test_retention_never_expires_a_quarantined_copy(
    client: httpx.AsyncClient,
    catalog: Engine,
    settings: Settings,
    job: str,
    new_policy: Callable[[], str],
) -> None:
    await seed(client, catalog, job, [1, 2, 3], tiers=("lustre", "s3"))
    name = new_policy()
    spec = {"tiers": {"lustre": {"keep_last": 1}, "s3": {"keep_last": 1}}}
    r = await client.post("/v1/policies", json={"name": name, "spec": spec})
    assert r.status_code == 201, r.text
    assert (await client.put(f"/v1/jobs/{job}/policy", json={"policy": name})).status_code == 200
    base = f"/v1/jobs/{job}/checkpoints"
    q1 = await client.post(f"{base}/1/quarantine", json={"reason": "diverged"})
    q2 = await client.post(f"{base}/2/quarantine", json={"reason": "bad", "tier": "lustre"})
    assert q1.status_code == 200 and q2.status_code == 200

    body = (await client.post(f"/v1/jobs/{job}/retention/plan")).json()
    expiries = {(e["tier"], e["step"]) for e in body["plan"]["expiries"]}
    keeps = {(k["tier"], k["step"]): k["reasons"] for k in body["plan"]["keeps"]}
    quarantined = {("lustre", 1), ("s3", 1), ("lustre", 2)}
    assert not expiries & quarantined
    for tier in ("lustre", "s3"):
        assert "quarantined" in keeps[(tier, 1)]
    assert "quarantined" in keeps[("lustre", 2)]

    # The executor's own re-check under row locks refuses too.
    with Session(catalog) as s:
        cid = s.execute(
            text(
                "SELECT c.id FROM checkpoint c JOIN job j ON j.id = c.job_id "
                "WHERE j.name = :job AND c.step = 1"
            ),
            {"job": job},
        ).scalar_one()
        result = begin_expiry(s, job, cid, "lustre", tier_refs(settings.tiers), datetime.now(UTC))
        s.rollback()
    assert result.state is BeginState.SKIPPED and "quarantined" in (result.reason or "")

    # Lifted, the same copies are the policy's again.
    await client.delete(f"{base}/1/quarantine")
    await client.delete(f"{base}/2/quarantine", params={"tier": "lustre"})
    body = (await client.post(f"/v1/jobs/{job}/retention/plan")).json()
    expiries = {(e["tier"], e["step"]) for e in body["plan"]["expiries"]}
    assert {("lustre", 1), ("lustre", 2)} <= expiries


async def _plan(client: httpx.AsyncClient, job: str) -> tuple[set[Any], dict[Any, list[str]]]:
    body = (await client.post(f"/v1/jobs/{job}/retention/plan")).json()
    expiries = {(e["tier"], e["step"]) for e in body["plan"]["expiries"]}
    keeps = {(k["tier"], k["step"]): k["reasons"] for k in body["plan"]["keeps"]}
    return expiries, keeps


async def test_a_training_jobs_quarantine_hides_but_does_not_hold_storage(
    client: httpx.AsyncClient,
    catalog: Engine,
    settings: Settings,
    job: str,
    new_policy: Callable[[], str],
) -> None:
    await seed(client, catalog, job, [1, 2, 3], tiers=("lustre", "s3"))
    name = new_policy()
    spec = {"tiers": {"lustre": {"keep_last": 1}, "s3": {"keep_last": 1}}}
    assert (await client.post("/v1/policies", json={"name": name, "spec": spec})).is_success
    assert (await client.put(f"/v1/jobs/{job}/policy", json={"policy": name})).is_success
    trainer = as_token(catalog, "trainer", [f"train:{job}"])
    url = f"/v1/jobs/{job}/checkpoints/1/quarantine"

    r = await client.post(url, json={"reason": NAN}, headers=trainer)
    assert r.status_code == 200 and r.json()["quarantine_reason"] == NAN, r.text
    # Hidden from restores...
    assert (
        await client.post(
            f"/v1/jobs/{job}/checkpoints/1/leases", json={"ttl_seconds": 60}, headers=trainer
        )
    ).status_code == 409
    # ...but not kept past the policy: the copies go or stay as they would have without it (the
    # s3 copy stays as the last copy of a checkpoint the ssd tier, with no rules, still claims).
    expiries, keeps = await _plan(client, job)
    assert ("lustre", 1) in expiries, keeps
    assert keeps[("s3", 1)] == ["last_copy"], keeps
    with Session(catalog) as s:
        cid = s.execute(
            text(
                "SELECT c.id FROM checkpoint c JOIN job j ON j.id = c.job_id "
                "WHERE j.name = :job AND c.step = 1"
            ),
            {"job": job},
        ).scalar_one()
        begun = begin_expiry(s, job, cid, "lustre", tier_refs(settings.tiers), datetime.now(UTC))
        s.rollback()
    assert begun.state is BeginState.EXPIRING, begun
    # The job cannot lift it either (that takes operate).
    lift = await client.delete(url, headers=trainer)
    assert lift.status_code == 403 and lift.json()["code"] == "insufficient_scope"

    # An operator's word makes it evidence: kept everywhere; the job's later report leaves it so.
    alice = as_token(catalog, "alice", ["operate"])
    held = await client.post(url, json={"reason": "keep for the post-mortem"}, headers=alice)
    assert held.status_code == 200, held.text
    again = await client.post(url, json={"reason": "failed to load"}, headers=trainer)
    assert again.json()["quarantine_reason"] == "keep for the post-mortem"
    expiries, keeps = await _plan(client, job)
    assert not {("lustre", 1), ("s3", 1)} & expiries
    assert "quarantined" in keeps[("lustre", 1)] and "quarantined" in keeps[("s3", 1)]
    assert [(k, a, d.get("evidence")) for k, _, a, d in _events(catalog, job)] == [
        ("quarantined", "trainer", False),
        ("quarantined", "alice", True),
    ]


async def test_a_tier_does_not_count_a_corrupt_replica_as_verified(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    """A copy quarantined when a read found one replica corrupt (as copies did before they
    demoted the tier) reports that shard as not verified, though its marker says restorable."""
    await seed(client, catalog, job, [1], tiers=("lustre",))
    set_replicas(catalog, job, 1, "lustre", "corrupt", paths=["s1/0"])
    set_marker(catalog, job, 1, "lustre", "restorable", quarantine="1 shard(s) found corrupt")
    body = (await client.get(f"/v1/jobs/{job}/checkpoints/1")).json()
    progress = _tier(body, "lustre")["progress"]
    assert (progress["shards_verified"], progress["shards_total"]) == (1, 2), body
    listed = (await client.get(f"/v1/jobs/{job}/checkpoints")).json()
    shown = next(t for t in listed["items"][0]["tiers"] if t["tier"] == "lustre")
    assert shown["progress"]["shards_verified"] == 1, listed
