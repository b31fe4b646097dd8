"""The CLI commands that talk to the API run against the real app: the API tests' fixtures
(tests/helpers/api_fixtures.py)."""

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
