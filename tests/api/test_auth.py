"""Access control: every route's access rule, 401 and 403 problems, each scope allowed and refused
where it should be, expired and revoked tokens, secrets stored only as digests, the actor of
events, and the insecure mode. Requests go to the real app on this module's catalog."""

from __future__ import annotations

import contextlib
import hashlib
import re
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from fastapi.routing import RouteContext
from sqlalchemy import Engine, text
from temporalio.client import Client

from api.app import create_app
from api.auth import access_of, api_routes
from tests.helpers.api import NODE_A, events, manifest, running_client, shard
from tests.helpers.tokens import bearer, create_token
from tierpoint.catalog.engine import sync_sessions
from tierpoint.catalog.token import tokens
from tierpoint.config import Settings

PROBLEM = "application/problem+json"
DOC = Path(__file__).resolve().parents[2] / "docs" / "security.md"
# Values that make every path template a concrete URL.
PATH_VALUES = {"job": "llama-7b", "step": "1", "name": "pol", "lease_id": "1"}
KEEP2 = {"kinds": {"local": {"keep_last": 2}}}


def _routes(settings: Settings) -> list[RouteContext]:
    return api_routes(create_app(settings))


def _url(route: RouteContext) -> str:
    def value(m: re.Match[str]) -> str:
        return PATH_VALUES.get(m.group(1), "x")

    assert route.path_format is not None
    return re.sub(r"\{(\w+)(?::\w+)?\}", value, route.path_format)


def _is_public(route: RouteContext) -> bool:
    return access_of(route)[0].describe() == "open"


def test_every_route_declares_exactly_one_access_rule(settings: Settings) -> None:
    """A route added without a scope decision fails here (add `dependencies=[Depends(require(
    ...))]` and a row in docs/security.md)."""
    missing = [
        f"{sorted(r.methods or ())} {r.path_format}: {len(access_of(r))} access rules"
        for r in _routes(settings)
        if len(access_of(r)) != 1
    ]
    assert missing == []


def test_the_security_doc_lists_every_route_with_its_rule(settings: Settings) -> None:
    documented = set(
        re.findall(
            r"^\| `(GET|POST|PUT|DELETE|PATCH) ([^`]+)` \| ([^|]+?) \|", DOC.read_text(), re.M
        )
    )
    actual = {
        (method, r.path_format, access_of(r)[0].describe())
        for r in _routes(settings)
        for method in sorted(r.methods or ())
    }
    assert actual - documented == set(), "routes missing from (or wrong in) docs/security.md"
    assert documented - actual == set(), "docs/security.md lists routes the app does not have"


@pytest.fixture
async def anonymous(settings: Settings, nodes: tuple[str, str]) -> AsyncIterator[httpx.AsyncClient]:
    """The app; requests carry only the headers a test gives them."""
    async for c in running_client(create_app(settings), authenticated=False):
        yield c


async def test_every_route_refuses_a_request_without_a_valid_token(
    settings: Settings, anonymous: httpx.AsyncClient, catalog: Engine
) -> None:
    routes = _routes(settings)
    guarded = [r for r in routes if not _is_public(r)]
    assert len(guarded) >= 20
    garbage = "tp_" + "A" * 43  # the right shape, no such token
    for route in guarded:
        for method in route.methods or ():
            url = _url(route)
            for headers, code in [
                ({}, "missing_token"),
                ({"Authorization": "Basic dXNlcjpwYXNz"}, "missing_token"),
                (bearer("not-a-token"), "invalid_token"),
                (bearer(garbage), "invalid_token"),
            ]:
                r = await anonymous.request(method, url, headers=headers, json={})
                assert r.status_code == 401, (method, url, headers, r.text)
                assert r.headers["content-type"] == PROBLEM
                assert r.json()["code"] == code, (method, url, r.text)
                assert r.headers["www-authenticate"].startswith("Bearer"), r.headers
    for route in routes:
        if _is_public(route):
            r = await anonymous.get(_url(route))
            assert r.status_code != 401, (route.path_format, r.text)


async def test_openapi_declares_bearer_auth_and_the_refusals(
    anonymous: httpx.AsyncClient,
) -> None:
    doc = (await anonymous.get("/openapi.json")).json()
    assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    register = doc["paths"]["/v1/jobs/{job}/checkpoints"]["post"]
    assert register["x-tierpoint-access"] == "train:<job>"
    assert {"401", "403"} <= set(register["responses"])
    assert register["security"] == [{"bearer": []}]
    health = doc["paths"]["/healthz"]["get"]
    assert "security" not in health and "401" not in health["responses"]


@pytest.fixture
async def jobs(temporal: Client, catalog: Engine) -> AsyncIterator[tuple[str, str]]:
    """A llama-7b job and a gpt-x job of this test; their workflows and rows go afterwards."""
    suffix = uuid.uuid4().hex[:8]
    names = (f"llama-7b-{suffix}", f"gpt-x-{suffix}")
    yield names
    for name in names:
        for prefix in ("checkpoint/", "retention/"):
            async for wf in temporal.list_workflows(f"WorkflowId STARTS_WITH '{prefix}{name}'"):
                with contextlib.suppress(Exception):
                    await temporal.get_workflow_handle(wf.id).terminate("test finished")
    with catalog.begin() as conn:
        conn.execute(text("DELETE FROM job WHERE name = ANY(:n)"), {"n": list(names)})


def _register(step: int) -> dict[str, object]:
    return manifest(step, [shard(f"s{step}/0", NODE_A)])


async def test_a_training_token_works_on_its_own_jobs_only(
    anonymous: httpx.AsyncClient, catalog: Engine, jobs: tuple[str, str], policy_names: list[str]
) -> None:
    llama, gpt = jobs
    name = f"trainer-{uuid.uuid4().hex[:6]}"
    trainer = bearer(create_token(catalog, name, ["train:llama-"]))

    r = await anonymous.post(f"/v1/jobs/{llama}/checkpoints", json=_register(1), headers=trainer)
    assert r.status_code == 201, r.text
    assert [e["actor"] for e in events(catalog, "registered", job=llama)] == [name]
    for method, url in [
        ("GET", f"/v1/jobs/{llama}/checkpoints"),
        ("GET", f"/v1/jobs/{llama}/checkpoints/1"),
        ("GET", f"/v1/jobs/{llama}/policy"),
        ("GET", f"/v1/jobs/{llama}/usage"),
        ("GET", "/v1/tiers"),
    ]:
        assert (await anonymous.request(method, url, headers=trainer)).status_code == 200, url

    before = _count(catalog)
    for method, url, body in [
        ("POST", f"/v1/jobs/{gpt}/checkpoints", _register(1)),
        ("GET", f"/v1/jobs/{gpt}/checkpoints", None),
        ("POST", "/v1/policies", {"name": "pol-trainer", "spec": KEEP2}),
        ("PUT", f"/v1/jobs/{llama}/policy", {"policy": None}),
        ("PUT", f"/v1/jobs/{llama}/checkpoints/1/pin", None),
        ("GET", "/v1/jobs", None),
        ("GET", "/v1/policies", None),
    ]:
        r = await anonymous.request(method, url, json=body, headers=trainer)
        assert r.status_code == 403, (method, url, r.text)
        assert r.headers["content-type"] == PROBLEM
        problem = r.json()
        assert problem["code"] == "insufficient_scope"
        assert name in problem["detail"] and "required_scope" in problem
        assert 'error="insufficient_scope"' in r.headers["www-authenticate"]
    assert _count(catalog) == before
    policy_names.append("pol-trainer")


async def test_a_token_asks_what_it_may_do_with_a_job_and_the_answer_is_the_routes_rule(
    anonymous: httpx.AsyncClient, catalog: Engine, jobs: tuple[str, str]
) -> None:
    llama, gpt = jobs
    suffix = uuid.uuid4().hex[:6]
    tokens_by_scope = {
        scope: bearer(create_token(catalog, f"{scope.replace(':', '-')}{suffix}", [scope]))
        for scope in ("train:llama-", "read", "operate", "admin")
    }
    expected = {
        # (scope, job): (read, register, lease)
        ("train:llama-", llama): (True, True, True),
        ("train:llama-", gpt): (False, False, False),
        ("read", llama): (True, False, False),
        ("operate", llama): (False, False, True),
        ("admin", gpt): (True, True, True),
    }
    before = _count(catalog)
    for (scope, job), (read, register, lease) in expected.items():
        headers = tokens_by_scope[scope]
        r = await anonymous.get(f"/v1/jobs/{job}/access", headers=headers)
        assert r.status_code == 200, r.text
        got = r.json()
        assert (got["read"], got["register"], got["lease"]) == (read, register, lease), scope
        assert got["job"] == job and got["token"].endswith(suffix)
        # The answer is what the routes do: a registration by a token told "no" is refused.
        reg = await anonymous.post(f"/v1/jobs/{job}/checkpoints", json={}, headers=headers)
        assert reg.status_code == (422 if register else 403), (scope, job, reg.text)
    assert _count(catalog) == before

    r = await anonymous.get(f"/v1/jobs/{llama}/access")
    assert r.status_code == 401 and r.headers["content-type"] == PROBLEM
    r = await anonymous.get("/v1/jobs/bad%00name/access", headers=tokens_by_scope["admin"])
    assert r.status_code == 422 and r.headers["content-type"] == PROBLEM, r.text


async def test_read_operate_and_admin_tokens(
    anonymous: httpx.AsyncClient, catalog: Engine, jobs: tuple[str, str], policy_names: list[str]
) -> None:
    llama, _ = jobs
    reader = bearer(create_token(catalog, f"reader-{uuid.uuid4().hex[:6]}", ["read"]))
    operator = bearer(create_token(catalog, f"op-{uuid.uuid4().hex[:6]}", ["operate", "read"]))
    operate_only = bearer(create_token(catalog, f"op1-{uuid.uuid4().hex[:6]}", ["operate"]))
    admin_name = f"admin-{uuid.uuid4().hex[:6]}"
    admin = bearer(create_token(catalog, admin_name, ["admin"]))
    policy = f"pol-{uuid.uuid4().hex[:8]}"
    policy_names.append(policy)

    async def status(method: str, url: str, headers: dict[str, str], body: object = None) -> int:
        return (await anonymous.request(method, url, json=body, headers=headers)).status_code

    register = f"/v1/jobs/{llama}/checkpoints"
    # Only training tokens (and admin) register; an admin's registration is its own.
    assert await status("POST", register, reader, _register(1)) == 403
    assert await status("POST", register, operator, _register(1)) == 403
    assert await status("POST", register, admin, _register(1)) == 201
    assert [e["actor"] for e in events(catalog, "registered", job=llama)] == [admin_name]

    # read: every read view, no change.
    for url in ["/v1/jobs", f"{register}/1", register, "/v1/policies", f"/v1/jobs/{llama}/policy"]:
        assert await status("GET", url, reader) == 200, url
    assert await status("PUT", f"{register}/1/pin", reader) == 403
    latest = f"{register}/latest"
    r = await anonymous.get(latest, params={"lease_ttl": 60}, headers=reader)
    assert r.status_code == 403 and r.json()["code"] == "insufficient_scope", r.text
    assert await status("POST", f"{register}/1/leases", reader, {"ttl_seconds": 60}) == 403

    # operate: operator actions, but no policies; and no reads without read.
    assert await status("PUT", f"{register}/1/pin", operator) == 200
    assert await status("DELETE", f"{register}/1/pin", operator) == 200
    assert await status("GET", "/v1/jobs", operate_only) == 403
    spec = {"name": policy, "spec": KEEP2}
    assert await status("POST", "/v1/policies", operator, spec) == 403
    assert await status("PUT", f"/v1/jobs/{llama}/policy", operator, {"policy": None}) == 403

    # admin: everything.
    assert await status("POST", "/v1/policies", admin, spec) == 201
    assert await status("PUT", f"/v1/jobs/{llama}/policy", admin, {"policy": policy}) == 200
    assert await status("GET", "/v1/jobs", admin) == 200


async def test_a_training_token_takes_and_releases_leases_on_its_jobs(
    anonymous: httpx.AsyncClient, catalog: Engine, jobs: tuple[str, str]
) -> None:
    llama, _ = jobs
    trainer = bearer(create_token(catalog, f"trainer-{uuid.uuid4().hex[:6]}", ["train:llama-"]))
    r = await anonymous.post(f"/v1/jobs/{llama}/checkpoints", json=_register(3), headers=trainer)
    assert r.status_code == 201, r.text
    # Nothing is restorable yet: the refusal is the lease's own (409), not the token's (403).
    leases = f"/v1/jobs/{llama}/checkpoints/3/leases"
    r = await anonymous.post(leases, json={"ttl_seconds": 60}, headers=trainer)
    assert r.status_code == 409 and r.json()["code"] == "not_leasable", r.text
    r = await anonymous.get(
        f"/v1/jobs/{llama}/checkpoints/latest", params={"lease_ttl": 60}, headers=trainer
    )
    assert r.status_code == 404 and r.json()["code"] == "no_restorable_checkpoint", r.text


async def test_expired_and_revoked_tokens_are_refused(
    anonymous: httpx.AsyncClient, catalog: Engine
) -> None:
    expired_name = f"old-{uuid.uuid4().hex[:6]}"
    expired = create_token(catalog, expired_name, ["read"], expires_in=timedelta(days=1))
    with catalog.begin() as conn:
        conn.execute(
            text(
                "UPDATE access_token SET expires_at = now() - interval '1 second' WHERE name = :n"
            ),
            {"n": expired_name},
        )
    r = await anonymous.get("/v1/jobs", headers=bearer(expired))
    assert r.status_code == 401 and r.json()["code"] == "token_expired", r.text
    assert 'error="invalid_token"' in r.headers["www-authenticate"]

    revoked_name = f"gone-{uuid.uuid4().hex[:6]}"
    revoked = create_token(catalog, revoked_name, ["admin"])
    with sync_sessions(catalog)() as s:
        tokens.revoke_token(s, revoked_name)
        s.commit()
    r = await anonymous.get("/v1/jobs", headers=bearer(revoked))
    assert r.status_code == 401 and r.json()["code"] == "token_revoked", r.text


@pytest.fixture
async def uncached(settings: Settings, nodes: tuple[str, str]) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings.model_copy(update={"token_cache_seconds": 0}))
    async for c in running_client(app, authenticated=False):
        yield c


async def test_a_revocation_applies_to_the_next_request_without_a_cache(
    uncached: httpx.AsyncClient, catalog: Engine
) -> None:
    name = f"rot-{uuid.uuid4().hex[:6]}"
    headers = bearer(create_token(catalog, name, ["read"]))
    assert (await uncached.get("/v1/jobs", headers=headers)).status_code == 200
    with sync_sessions(catalog)() as s:
        _, first = tokens.revoke_token(s, name)
        _, again = tokens.revoke_token(s, name)
        s.commit()
    assert (first, again) == (True, False)
    r = await uncached.get("/v1/jobs", headers=headers)
    assert r.status_code == 401 and r.json()["code"] == "token_revoked"


async def test_a_token_is_stored_as_its_digest_only(
    anonymous: httpx.AsyncClient, catalog: Engine
) -> None:
    name = f"stored-{uuid.uuid4().hex[:6]}"
    secret = create_token(catalog, name, ["train:llama-", "read"], expires_in=timedelta(days=90))
    assert re.fullmatch(r"tp_[A-Za-z0-9_-]{43}", secret)  # 32 random bytes
    with catalog.connect() as conn:
        row = conn.execute(
            text(
                "SELECT *, row_to_json(t)::text AS everything FROM access_token t WHERE name = :n"
            ),
            {"n": name},
        ).one()
        dump = conn.execute(text("SELECT string_agg(t::text, ' ') FROM access_token t")).scalar()
    assert row.digest == hashlib.sha256(secret.encode()).hexdigest()
    assert row.scopes == ["read", "train:llama-"]
    assert row.last_used_at is None
    assert row.expires_at is not None
    assert secret not in row.everything and secret[3:] not in str(dump)

    assert (await anonymous.get("/v1/tiers", headers=bearer(secret))).status_code == 200
    with catalog.connect() as conn:
        used = conn.execute(
            text("SELECT last_used_at FROM access_token WHERE name = :n"), {"n": name}
        ).scalar()
    assert used is not None


def test_scopes_and_names_are_checked_when_a_token_is_made(catalog: Engine) -> None:
    from tierpoint.errors import InvalidScope, RequestInvalid, TokenExists

    with sync_sessions(catalog)() as s:
        for scopes in (["write"], ["train:"], ["train:../x"], [], ["Admin"]):
            with pytest.raises(InvalidScope):
                tokens.create_token(s, f"t-{uuid.uuid4().hex[:6]}", scopes, None)
        with pytest.raises(RequestInvalid):
            tokens.create_token(s, "has space", ["read"], None)
        name = f"dup-{uuid.uuid4().hex[:6]}"
        tokens.create_token(s, name, ["read"], None)
        s.commit()
        with pytest.raises(TokenExists):
            tokens.create_token(s, name, ["read"], None)


@pytest.fixture
def insecure_settings(settings: Settings) -> Iterator[Settings]:
    yield settings.model_copy(update={"insecure_no_auth": True})


async def test_without_auth_everyone_is_anonymous(
    insecure_settings: Settings,
    nodes: tuple[str, str],
    catalog: Engine,
    jobs: tuple[str, str],
    capfd: pytest.CaptureFixture[str],
) -> None:
    llama, _ = jobs
    async for c in running_client(create_app(insecure_settings), authenticated=False):
        r = await c.post(f"/v1/jobs/{llama}/checkpoints", json=_register(1))
        assert r.status_code == 201, r.text
        assert (await c.get("/v1/jobs")).status_code == 200
    assert [e["actor"] for e in events(catalog, "registered", job=llama)] == ["anonymous"]
    captured = capfd.readouterr()
    assert "AUTHENTICATION IS OFF" in captured.out + captured.err


def _count(catalog: Engine) -> dict[str, int]:
    with catalog.connect() as conn:
        return {
            t: conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one()
            for t in ("job", "checkpoint", "retention_policy", "event", "restore_lease")
        }
