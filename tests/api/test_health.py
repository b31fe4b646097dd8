from __future__ import annotations

import httpx
import pytest

from api.app import create_app
from apps.devstack.services import free_port
from tests.helpers.api import running_client, scrape_api
from tests.helpers.services import Services, fresh_database
from tierpoint.catalog.migrate import SchemaMismatch
from tierpoint.config import Settings
from tierpoint.tier_config import TierConfig, TierKind


async def test_health_and_ready(client: httpx.AsyncClient) -> None:
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    r = await client.get("/readyz")
    assert r.status_code == 200, r.text
    assert r.json() == {
        "status": "ok",
        "checks": {"catalog": "ok", "temporal": "ok", "tier:s3": "ok"},
    }
    assert r.headers["x-request-id"]


async def test_not_ready_names_what_is_down(settings: Settings, nodes: tuple[str, str]) -> None:
    tiers = [
        *settings.tiers,
        TierConfig(
            name="s3-missing",
            kind=TierKind.S3,
            bucket="no-such-bucket-tierpoint",
            endpoint_url=settings.tiers[2].endpoint_url,
        ),
    ]
    broken = settings.model_copy(
        update={"temporal_address": f"127.0.0.1:{free_port()}", "tiers": tiers}
    )
    async for client in running_client(create_app(broken)):
        r = await client.get("/readyz")
        assert r.status_code == 503
        assert r.headers["content-type"] == "application/problem+json"
        problem = r.json()
        assert problem["code"] == "not_ready"
        assert problem["checks"]["catalog"] == "ok"
        assert problem["checks"]["tier:s3"] == "ok"
        assert problem["checks"]["temporal"].startswith("unreachable")
        assert "no-such-bucket-tierpoint" in problem["checks"]["tier:s3-missing"]
        assert "temporal" in problem["detail"] and "tier:s3-missing" in problem["detail"]
        assert (await client.get("/healthz")).status_code == 200


async def test_refuses_to_start_on_unmigrated_catalog(
    services: Services, settings: Settings
) -> None:
    empty = settings.model_copy(update={"database_url": fresh_database(services.database_url)})
    app = create_app(empty)
    with pytest.raises(SchemaMismatch, match="tierpoint migrate"):
        async with app.router.lifespan_context(app):
            pass


async def test_openapi_is_clean(client: httpx.AsyncClient) -> None:
    spec = (await client.get("/openapi.json")).json()
    ops = {op["operationId"] for path in spec["paths"].values() for op in path.values()}
    assert {
        "register_checkpoint",
        "get_checkpoint",
        "list_checkpoints",
        "latest_restorable",
        "list_jobs",
        "list_tiers",
        "healthz",
        "readyz",
    } <= ops
    register = spec["paths"]["/v1/jobs/{job}/checkpoints"]["post"]
    for status in ("409", "413", "422"):
        content = register["responses"][status]["content"]
        assert content["application/problem+json"]["schema"]["$ref"].endswith("/Problem")
    assert (await client.get("/docs")).status_code == 200


async def test_metrics_count_requests_by_route(client: httpx.AsyncClient, job: str) -> None:
    await client.get(f"/v1/jobs/{job}/checkpoints/latest")
    body = await scrape_api(client)
    assert (
        'tierpoint_api_requests_total{method="GET",route="/v1/jobs/{job}/checkpoints/latest",'
        'status="404"} 1.0'
    ) in body
    assert 'tierpoint_api_problems_total{code="no_restorable_checkpoint"} 1.0' in body
    assert "tierpoint_api_request_duration_seconds_bucket" in body
    # The raw path (with the job name) never becomes a label.
    assert job not in body


async def test_metrics_are_not_served_on_the_api_port(client: httpx.AsyncClient) -> None:
    """They name every job: a token of one job (or no token at all) must not read them there.
    Prometheus scrapes the app's own listener instead."""
    assert (await client.get("/metrics")).status_code == 404
    assert (await client.get("/metrics", headers={"Authorization": ""})).status_code == 404
    body = await scrape_api(client)
    assert "tierpoint_api_requests_total" in body
    assert 'route="/metrics"' not in body
