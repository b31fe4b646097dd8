"""Browser tests of the dashboard: the API tests' fixtures (a module catalog and namespace)."""

from tests.helpers.api_fixtures import catalog, client, job, nodes, temporal

__all__ = ["catalog", "client", "job", "nodes", "temporal"]
