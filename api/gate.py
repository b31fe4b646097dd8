"""The route class of every API route: who is asking is settled before anything of the request is
parsed, and a request body is decoded once, strictly.

FastAPI reads and decodes a route's JSON body before it resolves a single dependency, so a route
whose access rule is only a dependency answers a malformed body with 422 before it asks for a
token: a stranger learns about the route, and a read token about a write route. `GatedRoute` runs
the route's access rule (api/auth.py) first, then decodes the body, then hands the request to
FastAPI. `create_app` refuses to start with an API route of another class, and a route without
exactly one access rule cannot be declared at all.

The body is JSON, decoded with duplicate keys refused (`{"repair": false, "repair": true}` means
nothing a program should guess at) and with FastAPI's answer to malformed JSON (422 `json_invalid`);
FastAPI and the manifest reader then see the same bytes (the decoded value is reused by FastAPI).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute

from api.auth import Access, admit

_UNDECODED = object()


class DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKey(key)
            seen.add(key)
    return obj


def decode_json(body: bytes) -> Any:
    """A request body as JSON; raises RequestValidationError (422) for malformed JSON and for an
    object with a key twice, HTTPException (400) for bytes that are no text."""
    try:
        return json.loads(body, object_pairs_hook=_unique_keys)
    except DuplicateKey as exc:
        error = {
            "type": "duplicate_key",
            "loc": ("body",),
            "msg": f"the key {exc.key[:100]!r} appears twice in one object",
            "input": {},
        }
        raise RequestValidationError([error]) from None
    except json.JSONDecodeError as exc:
        invalid: dict[str, Any] = {
            "type": "json_invalid",
            "loc": ("body", exc.pos),
            "msg": "JSON decode error",
            "input": {},
            "ctx": {"error": exc.msg},
        }
        raise RequestValidationError([invalid]) from None
    except UnicodeDecodeError:
        raise HTTPException(400, "the request body is not UTF-8 text") from None


class StrictJsonRequest(Request):
    """A request whose `json()` is the strictly decoded body (FastAPI's body parsing calls it)."""

    _decoded: Any = _UNDECODED

    async def decode(self) -> None:
        body = await self.body()
        if body:
            self._decoded = decode_json(body)

    async def json(self) -> Any:
        if self._decoded is _UNDECODED:
            await self.decode()
        return self._decoded


def access_rule(route: APIRoute) -> Access:
    rules: list[Access] = []
    for dependency in route.dependencies:
        if isinstance(rule := dependency.dependency, Access):
            rules.append(rule)
    if len(rules) != 1:
        raise TypeError(
            f"route {route.name} ({route.path}) declares {len(rules)} access rules; it needs "
            "exactly one in its decorator: Depends(require(...)), require_job(...) or public"
        )
    return rules[0]


class GatedRoute(APIRoute):
    """Every router of the API is `APIRouter(route_class=GatedRoute)`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handle = super().get_route_handler()
        rule = access_rule(self)

        async def gated(request: Request) -> Response:
            # 401/403 before a byte of the body or a parameter is looked at.
            # guard: auth-before-validation
            await admit(request, rule)
            strict = StrictJsonRequest(request.scope, request.receive)
            try:
                await strict.decode()
            except (HTTPException, RequestValidationError):
                raise
            except Exception as exc:  # a client that went away mid-body, a broken stream
                raise HTTPException(400, "there was an error reading the body") from exc
            return await handle(strict)

        return gated
