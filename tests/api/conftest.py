"""Fixtures for API tests: the real app over httpx's ASGI transport on this module's catalog and
Temporal namespace (tests/helpers/api_fixtures.py)."""

from tests.helpers.api_fixtures import (
    catalog,
    client,
    job,
    new_policy,
    nodes,
    policy_names,
    temporal,
)

__all__ = ["catalog", "client", "job", "new_policy", "nodes", "policy_names", "temporal"]
