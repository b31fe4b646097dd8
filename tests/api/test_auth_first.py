"""Authentication and authorization come before any parsing, on every route the app serves: a
malformed body, invalid path values and bad query values get 401 without a token and 403 with a
token whose scopes do not allow the route, never a 422 that tells a stranger about the route.

The routes are read from the app's own route table, so a route added later is covered too."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi.routing import RouteContext
from sqlalchemy import Engine

from api.app import create_app
from api.auth import Requirement, access_of, api_routes
from tests.helpers.api import running_client
from tests.helpers.tokens import bearer, create_token
from tierpoint.auth import Principal
from tierpoint.config import Settings

PROBLEM = "application/problem+json"
# Path values no route accepts: a job name that may not start with '-', a negative step, ...
BAD_PATH = {"job": "-bad job", "step": "-1", "lease_id": "0", "run_id": "zz", "node": "a%7F"}
BAD_BODY = b'{bad, "a": 1, "a": 2'
BAD_QUERY = {"limit": "-5", "cursor": "\x00", "tier": "\x00", "lease_ttl": "0", "all": "maybe"}
# Scopes of tokens that some routes refuse; each is tried where its rule does not allow it.
NARROW_SCOPES = (("train:zz-no-such-job-",), ("read",), ("operate",))


def _bad_url(route: RouteContext) -> str:
    def value(m: re.Match[str]) -> str:
        return BAD_PATH.get(m.group(1), "-")

    assert route.path_format is not None
    return re.sub(r"\{(\w+)(?::\w+)?\}", value, route.path_format)


def _guarded(settings: Settings) -> list[tuple[str, RouteContext, Requirement]]:
    out: list[tuple[str, RouteContext, Requirement]] = []
    for route in api_routes(create_app(settings)):
        rule = access_of(route)[0]
        if isinstance(rule, Requirement):
            out.extend((method, route, rule) for method in sorted(route.methods or ()))
    return out


@pytest.fixture
async def anonymous(settings: Settings, nodes: tuple[str, str]) -> AsyncIterator[httpx.AsyncClient]:
    async for c in running_client(create_app(settings), authenticated=False):
        yield c


async def _send(
    client: httpx.AsyncClient, method: str, route: RouteContext, headers: dict[str, str]
) -> httpx.Response:
    return await client.request(
        method,
        _bad_url(route),
        params=BAD_QUERY,
        content=BAD_BODY,
        headers={"content-type": "application/json", **headers},
    )


async def test_no_token_gets_401_before_the_body_or_parameters_are_parsed(
    settings: Settings, anonymous: httpx.AsyncClient
) -> None:
    guarded = _guarded(settings)
    assert len(guarded) >= 20
    wrong = []
    for method, route, _rule in guarded:
        r = await _send(anonymous, method, route, {})
        if r.status_code != 401 or r.headers["content-type"] != PROBLEM:
            wrong.append((method, route.path_format, r.status_code, r.text[:120]))
    assert wrong == []


async def test_a_token_without_the_scope_gets_403_before_anything_is_parsed(
    settings: Settings, anonymous: httpx.AsyncClient, catalog: Engine
) -> None:
    guarded = _guarded(settings)
    tried = 0
    wrong = []
    for scopes in NARROW_SCOPES:
        principal = Principal("narrow", frozenset(scopes))
        headers = bearer(create_token(catalog, scopes=scopes))
        for method, route, rule in guarded:
            if rule.allows(principal, BAD_PATH["job"]):
                continue
            tried += 1
            r = await _send(anonymous, method, route, headers)
            if r.status_code != 403 or r.json().get("code") != "insufficient_scope":
                wrong.append((scopes, method, route.path_format, r.status_code, r.text[:120]))
    assert tried >= 20
    assert wrong == []


async def test_the_reported_routes_answer_401_and_403_to_a_malformed_body(
    anonymous: httpx.AsyncClient, catalog: Engine
) -> None:
    """The cases as first seen: reconcile, quarantine, lease and policy routes."""
    json_type = {"content-type": "application/json"}
    read = {**json_type, **bearer(create_token(catalog, scopes=["read"]))}
    for method, url in [
        ("POST", "/v1/reconcile"),
        ("POST", "/v1/jobs/j/checkpoints/1/quarantine"),
        ("POST", "/v1/jobs/j/checkpoints/1/leases"),
        ("POST", "/v1/policies"),
        ("PUT", "/v1/jobs/j/policy"),
    ]:
        r = await anonymous.request(method, url, content=b"{bad", headers=json_type)
        assert r.status_code == 401, (url, r.text)
        r = await anonymous.request(method, url, content=b"{bad", headers=read)
        assert r.status_code == 403, (url, r.text)
