"""Fixtures of the observability tests: the API app on this module's catalog (cleanup of the
job's rows and workflows afterwards), and workers as real processes with JSON logs."""

from tests.helpers.api_fixtures import catalog, job, nodes, temporal

__all__ = ["catalog", "job", "nodes", "temporal"]
