"""Bearer-token authentication and the scope every route requires.

Every route declares exactly one access dependency, in its decorator:
`dependencies=[Depends(require(Scope.OPERATE))]`, `Depends(JOB_READ)` (that scope,
or a `train:<prefix>` scope matching the path's job), or `Depends(public)` (health, readiness).
The route class of every router (api/gate.py) refuses a route without one, and
tests/api/test_auth.py checks the table in docs/security.md against `describe()`.

Authentication and authorization run before the route's body, parameters or path are parsed
(`admit`, called by the route class before FastAPI sees the request): a request without a valid
token gets a 401 and one with too few scopes a 403, never a 422 that would tell it about the
route. The dependency then finds the principal already settled. Token records are cached by
digest for `token_cache_seconds` (a revocation takes effect within that time on every API
process); expiry is checked on every request.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from fastapi.routing import APIRoute, RouteContext, iter_route_contexts
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.deps import ApiState, get_state
from api.problems import problem_responses
from tierpoint.auth import (
    ANONYMOUS_PRINCIPAL,
    TRAIN,
    Principal,
    Scope,
    digest,
    looks_like_secret,
    principal_of,
)
from tierpoint.errors import InsufficientScope, InvalidToken, Unauthenticated

_bearer = HTTPBearer(
    auto_error=False,
    scheme_name="bearer",
    description="A tierpoint access token (`tp_...`): `tierpoint token create`.",
)


async def authenticate(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    settled: Principal | None = getattr(request.state, "principal", None)
    if settled is not None:
        return settled
    state: ApiState = get_state(request)
    if state.settings.insecure_no_auth:
        return ANONYMOUS_PRINCIPAL
    if credentials is None:
        raise Unauthenticated("this route needs a token: send `Authorization: Bearer tp_...`")
    secret = credentials.credentials
    record = None
    if looks_like_secret(secret):
        record = await state.tokens.record(digest(secret), state.sessions)
    if record is None:
        raise InvalidToken("the bearer token is not a valid tierpoint token")
    principal = principal_of(record, datetime.now(UTC))
    request.state.principal = principal
    return principal


PrincipalDep = Annotated[Principal, Depends(authenticate)]


async def _actor(principal: PrincipalDep) -> str:
    # A coroutine so that FastAPI calls it on the event loop, not through its thread pool.
    return principal.name


# Who makes a change, recorded in its event: the token's name ("anonymous" without auth).
Actor = Annotated[str, Depends(_actor)]


class Access:
    """The base of every route's access dependency (what the route-table test looks for)."""

    def describe(self) -> str:
        raise NotImplementedError


class _Public(Access):
    def describe(self) -> str:
        return "open"

    async def __call__(self) -> None:
        return None


public = _Public()


@dataclass(frozen=True)
class Requirement(Access):
    """Any of `scopes`; or, if `job_scoped`, a `train:<prefix>` scope whose prefix starts the
    path's job name. `admin` allows everything."""

    scopes: tuple[Scope, ...]
    job_scoped: bool
    any_token: bool = False

    def describe(self) -> str:
        if self.any_token:
            return "any token"
        names = [s.value for s in self.scopes]
        if self.job_scoped:
            names.append(f"{TRAIN}<job>")
        return ", ".join(names) if names else Scope.ADMIN.value

    def allows(self, principal: Principal, job: str | None) -> bool:
        if self.any_token:
            return True
        if principal.has(Scope.ADMIN) or any(principal.has(s) for s in self.scopes):
            return True
        # guard: auth-scope-ignored
        return self.job_scoped and job is not None and principal.trains(job)

    def check(self, principal: Principal, job: str | None) -> Principal:
        if self.allows(principal, job):
            return principal
        wanted = [s.value for s in self.scopes]
        if self.job_scoped and job is not None:
            wanted.append(f"{TRAIN}{job}")
        needed = " ".join(wanted) or Scope.ADMIN.value
        held = ", ".join(sorted(principal.scopes))
        raise InsufficientScope(
            f"token {principal.name!r} (scopes: {held}) may not do this; it needs one of: "
            f"{', '.join(needed.split())} (or admin)",
            required=needed,
        )

    async def __call__(self, request: Request, principal: PrincipalDep) -> Principal:
        # The raw path value: validation of the job name comes after authorization.
        job = request.path_params.get("job") if self.job_scoped else None
        return self.check(principal, job)


async def admit(request: Request, rule: Access) -> None:
    """The route's access rule, applied to the raw request before anything of it is parsed."""
    if isinstance(rule, Requirement):
        await rule(request, await authenticate(request, await _bearer(request)))


def require(*scopes: Scope) -> Requirement:
    """A token with any of `scopes` (or admin)."""
    return Requirement(tuple(scopes), job_scoped=False)


def require_job(*scopes: Scope) -> Requirement:
    """A token with any of `scopes`, or a train scope covering the path's job (or admin)."""
    return Requirement(tuple(scopes), job_scoped=True)


def require_token() -> Requirement:
    """Any valid token: what every client needs whatever its scopes (the tier list)."""
    return Requirement((), job_scoped=False, any_token=True)


# A write that a training job does for its own jobs and an operator for any: taking, renewing and
# releasing a restore lease (a lease holds the checkpoint's copies), and changing a job's
# timeline (a rollback, a fork, a verdict).
JOB_WRITE = require_job(Scope.OPERATE)
LEASE_WRITE = JOB_WRITE
# Registering a checkpoint: the job's own training token, or admin.
REGISTER = require_job()
# Reading a job's checkpoints and their copies.
JOB_READ = require_job(Scope.READ)


def api_routes(app: FastAPI) -> list[RouteContext]:
    """Every API route of the app as served (with its router's prefix and dependencies)."""
    return [c for c in iter_route_contexts(app.routes) if isinstance(c.original_route, APIRoute)]


def access_of(route: RouteContext) -> list[Access]:
    """The access dependencies a route declares (exactly one when the route is right)."""
    found: list[Access] = []
    for dependency in route.dependant.dependencies:
        call: object = dependency.call
        if isinstance(call, Access):
            found.append(call)
    return found


def document(openapi: dict[str, Any], app: FastAPI) -> dict[str, Any]:
    """Each operation says what it needs (`x-tierpoint-access`) and its 401/403 problems."""
    refusals = problem_responses(401, 403)
    for route in api_routes(app):
        rules = access_of(route)
        for method in route.methods or ():
            op = openapi.get("paths", {}).get(route.path_format, {}).get(method.lower())
            if op is None or not rules:
                continue
            op["x-tierpoint-access"] = rules[0].describe()
            if isinstance(rules[0], _Public):
                op.pop("security", None)
            else:
                for status, response in refusals.items():
                    op.setdefault("responses", {}).setdefault(str(status), response)
    return openapi
