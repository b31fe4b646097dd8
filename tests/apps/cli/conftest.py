"""The CLI commands that talk to the API run against the real app: the API tests' fixtures
(tests/helpers/api_fixtures.py), and the app served by uvicorn for commands run as processes."""

from tests.helpers.api_fixtures import (
    catalog,
    client,
    job,
    new_policy,
    nodes,
    policy_names,
    temporal,
)
from tests.helpers.cli import api_url

__all__ = [
    "api_url",
    "catalog",
    "client",
    "job",
    "new_policy",
    "nodes",
    "policy_names",
    "temporal",
]
