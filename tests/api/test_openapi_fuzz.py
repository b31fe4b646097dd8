"""Schemathesis against the live API's own OpenAPI schema, every check on: no 5xx, every answer
matches its documented status, content type, headers and schema, no documented-valid request is
refused, every invalid one is, and 405s carry `Allow`.

The app is the real one (its lifespan on this module's catalog and Temporal namespace) under
uvicorn on a free 127.0.0.1 port. The number of examples per operation is bounded and the seed
fixed, so the run is the same each time and stays short; the case count is printed at the end
(for docs/reliability.md)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import Case, CheckContext
from schemathesis.config import SchemathesisConfig
from schemathesis.core.transport import Response
from schemathesis.openapi.checks import RejectedPositiveData
from schemathesis.specs.openapi.checks import positive_data_acceptance
from sqlalchemy.orm import Session

from api.app import create_app
from tests.helpers.api import NODE_A, NODE_B
from tests.helpers.cli import serving
from tests.helpers.services import Services, make_bucket, make_settings
from tierpoint.catalog.engine import make_sync_engine
from tierpoint.catalog.node.registry import upsert_node
from tierpoint.config import Settings

# Full-stack as a whole, said here too so that a run of the lighter tiers does not even collect it:
# schemathesis builds its cases at collection, most of the collection of the whole suite.
pytestmark = pytest.mark.full_stack

EXAMPLES = 25
CASES: dict[str, int] = {}


@pytest.fixture(scope="module")
def fuzz_settings(
    services: Services,
    migrated_url: str,
    temporal_namespace: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Settings:
    root = tmp_path_factory.mktemp("fuzz")
    (root / "lustre").mkdir()
    # The nodes the schema's examples name, so that example registrations are accepted.
    engine = make_sync_engine(migrated_url, pool_size=1)
    with Session(engine) as s:
        for node in (NODE_A, NODE_B):
            upsert_node(s, node, {})
        s.commit()
    engine.dispose()
    return make_settings(services, migrated_url, root, make_bucket(services), temporal_namespace)


@pytest.fixture(scope="module")
async def live_api(fuzz_settings: Settings) -> AsyncIterator[str]:
    async with serving(create_app(fuzz_settings)) as url:
        yield url


# Refusals of schema-valid requests that no JSON schema can express: a node that never reported in,
# a cursor this API did not mint, a policy document whose rules contradict each other or name a
# tier that is not configured, the stripes of a tier that keeps whole copies, two shards with one
# path (uniqueness of one member across items), one shard's path a directory of another's (`a`
# and `a/b`), shards whose sizes add up to more than 2^63 - 1.
# Each is still a 422 problem with its code; any other refusal fails the check.
SEMANTIC_REFUSALS = frozenset({"unknown_node", "invalid_policy"})
SEMANTIC_FIELD_CODES = frozenset(
    {
        "invalid_cursor",
        "unknown_tier",
        "tier_not_coded",
        "invalid_policy",
        "duplicate_path",
        "path_conflict",
        "total_size_too_large",
    }
)


def valid_requests_accepted(ctx: CheckContext, response: Response, case: Case[Any]) -> bool | None:
    """schemathesis's positive_data_acceptance, except for the refusals above."""
    try:
        return positive_data_acceptance(ctx, response, case)
    except RejectedPositiveData:
        if response.status_code == 422 and _semantic(response.json()):
            return None
        raise


def _semantic(problem: dict[str, Any]) -> bool:
    if problem.get("code") in SEMANTIC_REFUSALS:
        return True
    codes = {e.get("code") for e in problem.get("errors") or []}
    return bool(codes) and codes <= SEMANTIC_FIELD_CODES


def _schema_of_the_app() -> dict[str, Any]:
    """The app's schema, made without starting it (nothing in it depends on the settings but the
    tier names, which make_settings shares); test_schema_is_the_live_one checks that."""
    return create_app(Settings(tiers=TIERS)).openapi()


TIERS = [
    {"name": "ssd", "kind": "local", "root": "/x/{node}"},
    {"name": "lustre", "kind": "shared", "root": "/x"},
    {"name": "s3", "kind": "s3", "bucket": "b"},
]
SCHEMA = _schema_of_the_app()
# Same cases every run: a fixed seed, no state kept between runs, and no values taken from
# earlier responses (ids and timestamps differ from run to run).
CONFIG = SchemathesisConfig.from_dict(
    {
        "seed": 20261201,
        "cache": {"enabled": False},
        "generation": {"max-examples": EXAMPLES, "deterministic": True},
        "phases": {
            "examples": {"extra-data-sources": {"responses": False}},
            "fuzzing": {"extra-data-sources": {"responses": False}},
        },
    }
)
schema = schemathesis.openapi.from_dict(SCHEMA, config=CONFIG)


@pytest.fixture(scope="module")
def base_url(live_api: str, request: pytest.FixtureRequest) -> Iterator[str]:
    failed_before = request.session.testsfailed
    yield live_api
    total = sum(CASES.values())
    # The operations that failed, counted by pytest: the line is quoted in docs/reliability.md.
    failed = request.session.testsfailed - failed_before
    line = f"schemathesis: {total} cases over {len(CASES)} operations, {failed} failed"
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():
            reporter.write_line(f"\n{line}")


def test_schema_is_the_live_one(live_api: str) -> None:
    assert httpx.get(f"{live_api}/openapi.json").json() == SCHEMA


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
def test_api_honours_its_schema(case: Case[Any], base_url: str) -> None:
    CASES[case.operation.label] = CASES.get(case.operation.label, 0) + 1
    case.call_and_validate(
        base_url=base_url,
        timeout=30,
        excluded_checks=[positive_data_acceptance],
        additional_checks=[valid_requests_accepted],
    )
