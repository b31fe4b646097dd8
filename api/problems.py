"""RFC 9457 problem+json for every error the API returns, each with a stable `code`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from temporalio.service import RPCError, RPCStatusCode

from api.schemas.problem import Problem
from tierpoint import logs
from tierpoint.catalog.engine import CATALOG_UNREACHABLE
from tierpoint.errors import (
    CatalogUnavailable,
    TemporalUnavailable,
    TierpointError,
    problem_body,
)

PROBLEM_MEDIA_TYPE = "application/problem+json"
MAX_FIELD_ERRORS = 100
# Routes whose body is a checkpoint manifest: body errors there are `invalid_manifest`.
MANIFEST_ROUTES = frozenset({"register_checkpoint"})
JOB_PARAM = ("path", "job")

log = logs.get(__name__)

# What a Temporal call answers when the server is away or does not answer in time (the API's
# client gives every call a deadline: api/temporal_link.py).
_TEMPORAL_AWAY = frozenset(
    {RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.CANCELLED}
)

_HTTP_CODES = {
    400: ("bad_request", "Bad request"),
    404: ("not_found", "Not found"),
    405: ("method_not_allowed", "Method not allowed"),
    413: ("request_too_large", "Request too large"),
}


class ProblemHTTPException(HTTPException):
    """An HTTPException with a stable code; raised where a domain error cannot be (middleware
    feeding the request body), and re-raised untouched by FastAPI's body parsing."""

    def __init__(self, status: int, code: str, title: str, detail: str) -> None:
        super().__init__(status_code=status, detail=detail)
        self.code = code
        self.title = title


class ProblemResponse(JSONResponse):
    media_type = PROBLEM_MEDIA_TYPE

    def render(self, content: Any) -> bytes:
        # ASCII-escaped: a detail may quote client input, which can hold lone surrogates that
        # have no UTF-8 encoding.
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def problem_response(
    status: int,
    code: str,
    title: str,
    detail: str,
    errors: Sequence[dict[str, Any]] | None = None,
    extra: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    return ProblemResponse(
        jsonable_encoder(problem_body(status, code, title, detail, errors, extra)),
        status_code=status,
        headers=headers,
    )


def _count(request: Request, code: str) -> None:
    metrics = getattr(request.app.state, "metrics", None)
    if metrics is None:
        return
    metrics.problems.labels(code).inc()
    if code == "checkpoint_conflict":
        metrics.conflicts.inc()


def _field(loc: Sequence[Any]) -> tuple[str, str]:
    where = str(loc[0]) if loc else "body"
    parts = list(loc[1:]) if where in ("body", "path", "query", "header", "cookie") else list(loc)
    text = ""
    for p in parts:
        text += f"[{p}]" if isinstance(p, int) else (f".{p}" if text else str(p))
    return where, text or where


def _distinct(raw: Sequence[Any]) -> list[Any]:
    """Each error once: a path parameter that a route and one of its dependencies both declare
    (the job name of a registration) is validated, and refused, twice."""
    seen: set[tuple[Any, ...]] = set()
    out = []
    for e in raw:
        key = (tuple(e.get("loc", ())), e.get("type"), str(e.get("msg")))
        if key not in seen:
            seen.add(key)
            out.append(e)
    return out


def validation_problem(request: Request, exc: RequestValidationError) -> JSONResponse:
    raw = _distinct(exc.errors())
    errors = []
    for e in raw[:MAX_FIELD_ERRORS]:
        where, name = _field(e.get("loc", ()))
        errors.append(
            {"field": name, "location": where, "message": str(e.get("msg")), "code": e["type"]}
        )
    types = {e["type"] for e in raw}
    route = request.scope.get("route")
    in_body = any(e.get("loc", ("",))[0] == "body" for e in raw)
    if "invalid_job_name" in types or any(tuple(e.get("loc", ())) == JOB_PARAM for e in raw):
        code, title = "invalid_job_name", "Invalid job name"
    elif "step_out_of_range" in types:
        code, title = "step_out_of_range", "Step out of range"
    elif types & {"size_out_of_range", "total_size_too_large"}:
        # Sizes the catalog could not count exactly: a shard's, or the checkpoint's total.
        code, title = "size_out_of_range", "Size out of range"
    elif getattr(route, "name", None) in MANIFEST_ROUTES and in_body:
        if "unsafe_path" in types:
            code, title = "unsafe_path", "Unsafe shard path"
        else:
            code, title = "invalid_manifest", "Invalid checkpoint manifest"
    elif "invalid_text" in types:
        # A NUL or a lone surrogate: text the catalog cannot store (tierpoint/json_types.py).
        code, title = "invalid_text", "Invalid text"
    else:
        code, title = "validation_error", "Invalid request"
    first = errors[0] if errors else None
    detail = f"{first['field']}: {first['message']}" if first else "the request is invalid"
    named = next((e for e in errors if e["code"] == "invalid_job_name"), None)
    if named is not None:
        detail = named["message"]  # it names the job name and says the rule
    if len(raw) > 1:
        detail += f" (and {len(raw) - 1} more)"
    _count(request, code)
    return problem_response(422, code, title, detail, errors)


def _allowed(request: Request) -> list[str]:
    """Every method some route serves at this path. Starlette's own 405 names only the methods
    of the first route that matched the path, and FastAPI has one route per method."""
    methods: set[str] = set()
    for route in request.app.router.routes:
        route_methods = getattr(route, "methods", None)
        if route_methods and route.matches(request.scope)[0] is not Match.NONE:
            methods.update(route_methods)
    return sorted(methods)


def install(app: FastAPI) -> None:
    @app.exception_handler(TierpointError)
    async def _domain(request: Request, exc: TierpointError) -> JSONResponse:
        _count(request, exc.code)
        # Every item has the members the Problem schema declares; domain errors about a body
        # need not repeat where they are.
        errors = [{"location": "body", **e} for e in exc.errors] if exc.errors is not None else None
        return problem_response(
            exc.status,
            exc.code,
            exc.title,
            exc.detail,
            errors,
            exc.extra,
            headers=exc.response_headers(),
        )

    async def _catalog_down(request: Request, exc: Exception) -> JSONResponse:
        # The catalog's server is down or unreachable: the request wrote nothing (its transaction
        # never committed) and the same request can be sent again once the catalog is back.
        log.warning("catalog unavailable", path=request.url.path, error=str(exc).splitlines()[0])
        return await _domain(
            request, CatalogUnavailable("the catalog database is unavailable; retry later")
        )

    for unreachable in CATALOG_UNREACHABLE:
        app.add_exception_handler(unreachable, _catalog_down)

    @app.exception_handler(RPCError)
    async def _temporal(request: Request, exc: RPCError) -> JSONResponse:
        if exc.status not in _TEMPORAL_AWAY:
            return await _unexpected(request, exc)
        log.warning("temporal unavailable", path=request.url.path, error=str(exc))
        return await _domain(
            request,
            TemporalUnavailable(f"Temporal did not answer ({exc.status.name}); retry later"),
        )

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return validation_problem(request, exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code, title = _HTTP_CODES.get(exc.status_code, ("http_error", "HTTP error"))
        code = getattr(exc, "code", code)
        title = getattr(exc, "title", title)
        headers = getattr(exc, "headers", None)
        if exc.status_code == 405:
            headers = {**(headers or {}), "Allow": ", ".join(_allowed(request))}
        _count(request, code)
        return problem_response(exc.status_code, code, title, str(exc.detail), headers=headers)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", path=request.url.path)
        _count(request, "internal_error")
        return problem_response(
            500, "internal_error", "Internal error", "an unexpected error occurred; see the logs"
        )


def problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """`responses=` entries declaring problem+json for the given statuses in OpenAPI."""
    descriptions = {
        400: "Malformed request (problem+json)",
        401: "Missing, invalid, expired or revoked bearer token (problem+json)",
        403: "The token's scopes do not allow this (problem+json)",
        404: "Not found (problem+json)",
        409: "Conflict (problem+json)",
        413: "Too large (problem+json)",
        422: "Invalid request (problem+json)",
        503: "Not ready (problem+json)",
    }
    return {
        s: {
            "description": descriptions.get(s, "Problem"),
            "content": {PROBLEM_MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}},
        }
        for s in statuses
    }


def add_schemas(openapi: dict[str, Any], *models: type[BaseModel]) -> dict[str, Any]:
    """Register schemas that operations refer to by $ref without FastAPI knowing the model:
    Problem (problem+json responses) and the manifest (a body parsed by hand)."""
    components = openapi.setdefault("components", {}).setdefault("schemas", {})
    every: list[type[BaseModel]] = [Problem, *models]
    for model in every:
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(schema.pop("$defs", {}))
        components[model.__name__] = schema
    return openapi
