"""The OpenAPI document as served: FastAPI's, plus what FastAPI cannot know. Every operation
declares the problems the app's own machinery answers whatever the route (a malformed or
oversized body, invalid parameters, a catalog outage), and `tier` parameters list the configured
tiers, so that no request the schema calls valid is refused for naming one."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from api.problems import problem_responses
from tierpoint.manifest import METADATA_VALUE_SCHEMA

_METHODS = ("get", "put", "post", "delete", "patch")
# The liveness probe answers without the catalog; /readyz declares its own 503.
_NO_CATALOG = frozenset({"/healthz"})


def document(openapi: dict[str, Any], tier_names: Sequence[str]) -> dict[str, Any]:
    for path, item in openapi.get("paths", {}).items():
        for method in _METHODS:
            op = item.get(method)
            if op is None:
                continue
            _common_problems(path, op)
            for param in op.get("parameters", []):
                if param.get("name") == "tier":
                    _enum_of(param["schema"], tier_names)
    for name, schema in openapi.get("components", {}).get("schemas", {}).items():
        tier = schema.get("properties", {}).get("tier")
        if name == "Quarantine" and tier is not None:
            _enum_of(tier, tier_names)
    components = openapi.setdefault("components", {}).setdefault("schemas", {})
    components["MetadataValue"] = METADATA_VALUE_SCHEMA
    metadata = components.get("Manifest", {}).get("properties", {}).get("metadata")
    if metadata is not None:
        metadata["additionalProperties"] = {"$ref": "#/components/schemas/MetadataValue"}
        metadata["propertyNames"] = METADATA_VALUE_SCHEMA["anyOf"][0] | {"type": "string"}
    # FastAPI's own 422 body; every 422 here is a Problem.
    openapi.get("components", {}).get("schemas", {}).pop("HTTPValidationError", None)
    openapi.get("components", {}).get("schemas", {}).pop("ValidationError", None)
    return openapi


def _common_problems(path: str, op: dict[str, Any]) -> None:
    responses: dict[str, Any] = op.setdefault("responses", {})
    statuses: list[int] = []
    if op.get("requestBody") is not None:
        # 400: the body is not text FastAPI can decode; 413: over the body size limit.
        statuses += [400, 413, 422]
    if op.get("parameters"):
        statuses.append(422)
    if path not in _NO_CATALOG:
        statuses.append(503)
    for status, entry in problem_responses(*statuses).items():
        existing = responses.get(str(status))
        if existing is None or "HTTPValidationError" in str(existing):
            responses[str(status)] = entry


def _enum_of(schema: dict[str, Any], names: Sequence[str]) -> None:
    """Restrict the string branch of a `str | None` (or `str`) schema to the given names."""
    branches = schema.get("anyOf", [schema])
    for branch in branches:
        if branch.get("type") == "string":
            branch.pop("pattern", None)
            branch["enum"] = list(names)
