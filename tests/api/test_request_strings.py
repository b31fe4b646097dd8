"""What a request may hold, on every route: strings the catalog can store (no NUL: 422
`invalid_text`, and the schema says so), JSON objects without a key twice, and values of exactly
their JSON type (`0` is not a boolean, `"1"` not an integer).

Routes, parameters and body schemas are read from the app itself, so routes added later are
covered too."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from pydantic import BaseModel, ValidationError

from api.app import create_app
from api.auth import api_routes
from tests.helpers.tokens import bearer, create_token
from tierpoint.config import Settings

PATH_VALUES = {"job": "llama-7b", "step": "1", "name": "pol", "lease_id": "1", "node": "n1"}
PATH_VALUES["run_id"] = "0" * 32
METHODS = ("get", "put", "post", "delete", "patch")
NUL = "a\x00b"


def _url(path: str) -> str:
    return re.sub(r"\{(\w+)(?::\w+)?\}", lambda m: PATH_VALUES.get(m.group(1), "x"), path)


def _resolve(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        schema = doc["components"]["schemas"][name]
    return schema


def _strings(
    doc: dict[str, Any], schema: dict[str, Any], where: str, seen: set[str]
) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every string schema reachable from `schema` (property names of free objects included)."""
    ref = schema.get("$ref")
    if ref is not None:
        if ref in seen:
            return
        seen = seen | {ref}
    schema = _resolve(doc, schema)
    if schema.get("type") == "string":
        yield where, schema
    for key in ("anyOf", "oneOf", "allOf"):
        for sub in schema.get(key, []):
            for at, found in _strings(doc, sub, where, seen):
                # A pattern beside anyOf applies to every string the branches allow.
                yield at, {"pattern": schema["pattern"], **found} if "pattern" in schema else found
    for name, sub in schema.get("properties", {}).items():
        yield from _strings(doc, sub, f"{where}.{name}", seen)
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            yield from _strings(doc, schema[key], f"{where}[]", seen)
    names = schema.get("propertyNames")
    if isinstance(names, dict):
        yield from _strings(doc, {"type": "string", **names}, f"{where}{{}}", seen)


def _request_strings(doc: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for path, item in doc["paths"].items():
        for method in METHODS:
            op = item.get(method)
            if op is None:
                continue
            for p in op.get("parameters", []):
                yield from _strings(
                    doc, p["schema"], f"{method} {path} {p['in']}:{p['name']}", set()
                )
            for media in op.get("requestBody", {}).get("content", {}).values():
                yield from _strings(doc, media["schema"], f"{method} {path} body", set())


def _refuses_nul(schema: dict[str, Any]) -> bool:
    if "enum" in schema or "const" in schema:
        return all("\x00" not in str(v) for v in schema.get("enum", [schema.get("const")]))
    pattern = schema.get("pattern")
    return pattern is not None and re.search(pattern, NUL) is None


def test_every_request_string_in_the_schema_refuses_nul(settings: Settings) -> None:
    doc = create_app(settings).openapi()
    found = list(_request_strings(doc))
    assert len(found) >= 30
    assert [where for where, schema in found if not _refuses_nul(schema)] == []


async def test_every_string_query_parameter_refuses_nul(
    settings: Settings, client: httpx.AsyncClient
) -> None:
    doc = create_app(settings).openapi()
    tried = 0
    wrong = []
    for path, item in doc["paths"].items():
        for method in METHODS:
            op = item.get(method)
            for p in (op or {}).get("parameters", []):
                if p["in"] != "query" or not list(_strings(doc, p["schema"], "", set())):
                    continue
                tried += 1
                r = await client.request(method, _url(path), params={p["name"]: NUL}, json={})
                refusals = {"invalid_text", "validation_error"}
                if p["name"] == "job":  # a job name, refused as one wherever it is named
                    refusals.add("invalid_job_name")
                if r.status_code != 422 or r.json()["code"] not in refusals:
                    wrong.append((method, path, p["name"], r.status_code, r.text[:200]))
    assert tried >= 10
    assert wrong == []


async def test_the_reported_nul_strings_are_refused(
    client: httpx.AsyncClient, job: str, catalog: Any
) -> None:
    train = bearer(create_token(catalog, scopes=[f"train:{job}"]))
    read = bearer(create_token(catalog, scopes=["read"]))
    url = f"/v1/jobs/{job}/checkpoints/1/corrupt-copies"
    for body in (
        {"tier": "lustre", "path": "a\x00", "reason": "bad"},
        {"tier": "lustre", "path": "a", "reason": "bad\x00"},
    ):
        r = await client.post(url, json=body, headers=train)
        assert r.status_code == 422, r.text
        assert r.json()["code"] == "invalid_text"
    r = await client.get("/v1/overview/jobs", params={"prefix": "\x00"}, headers=read)
    assert r.status_code == 422, r.text
    assert r.json()["code"] == "invalid_text"


async def test_nul_in_free_form_documents_is_refused(
    client: httpx.AsyncClient, job: str, new_policy: Any
) -> None:
    """Policy documents are JSON objects of the caller's choosing: a NUL in a key or a value."""
    for spec in (
        {"kinds": {"local\x00": {"keep_last": 2}}},
        {"x\x00": 1},
        {"tiers": {"a": "\x00"}},
    ):
        r = await client.post("/v1/policies", json={"name": new_policy(), "spec": spec})
        assert r.status_code == 422, r.text
        r = await client.post(f"/v1/jobs/{job}/retention/plan", json={"policy": spec})
        assert r.status_code in (404, 422), r.text


def _body_routes(settings: Settings) -> list[tuple[str, str]]:
    doc = create_app(settings).openapi()
    return [
        (method, path)
        for path, item in doc["paths"].items()
        for method in METHODS
        if "requestBody" in item.get(method, {})
    ]


async def test_every_json_body_with_a_key_twice_is_refused(
    settings: Settings, client: httpx.AsyncClient
) -> None:
    routes = _body_routes(settings)
    assert len(routes) >= 8
    wrong = []
    for method, path in routes:
        r = await client.request(
            method,
            _url(path),
            content=b'{"a": {"b": 1, "b": 1}}',
            headers={"content-type": "application/json"},
        )
        codes = [e["code"] for e in r.json().get("errors", [])] if r.status_code == 422 else []
        if codes != ["duplicate_key"]:
            wrong.append((method, path, r.status_code, r.text[:200]))
    assert wrong == []
    r = await client.post("/v1/reconcile", content=b'{"repair": false, "repair": true}')
    assert r.status_code == 422, r.text


def _body_models(settings: Settings) -> Iterator[type[BaseModel]]:
    for route in api_routes(create_app(settings)):
        field = getattr(route, "body_field", None)
        model = field.field_info.annotation if field is not None else None
        if isinstance(model, type) and issubclass(model, BaseModel):
            yield model


def test_request_bodies_take_booleans_and_integers_as_json_types_only(
    settings: Settings,
) -> None:
    """Each boolean or integer field of every request body model refuses the lax spellings."""
    checked = 0
    for model in _body_models(settings):
        schema = model.model_json_schema()
        for name, prop in schema.get("properties", {}).items():
            types = {prop.get("type")} | {s.get("type") for s in prop.get("anyOf", [])}
            for wrong, kind in ((0, "boolean"), ("1", "integer"), (1.5, "integer")):
                if kind not in types:
                    continue
                checked += 1
                with pytest.raises(ValidationError) as info:
                    model.model_validate_json(f'{{"{name}": {wrong!r}}}'.replace("'", '"'))
                locs = [e["loc"][:1] for e in info.value.errors()]
                assert (name,) in locs, (model.__name__, name, wrong)
    assert checked >= 4


async def test_reconcile_refuses_0_for_a_boolean(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/reconcile", json={"repair": 0})
    assert r.status_code == 422, r.text
    assert r.json()["errors"][0]["field"] == "repair"
