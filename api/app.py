"""The tierpoint REST API: `create_app(settings)`, served by uvicorn (`tierpoint api`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any
from wsgiref.simple_server import WSGIServer

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute

from api import auth, problems
from api import openapi as openapi_doc
from api.deps import ApiState
from api.gate import GatedRoute
from api.metrics_refresh import CatalogGauges
from api.middleware import BodySizeLimit, RequestObserver
from api.routers import (
    actions,
    api_docs,
    checkpoints,
    dashboard,
    deletion,
    failures,
    health,
    integrity,
    jobs,
    leases,
    nodes,
    operations,
    pins,
    policies,
    quarantine,
    restores,
    retention,
    tiers,
    timeline,
)
from api.temporal_link import TemporalLink
from api.token_cache import TokenCache
from tierpoint import logs
from tierpoint.catalog.engine import async_sessions, make_async_engine
from tierpoint.catalog.migrate import check_schema_async
from tierpoint.catalog.node import registry as node_registry
from tierpoint.config import Settings
from tierpoint.manifest import Manifest
from tierpoint.metrics_api import ApiMetrics
from tierpoint.services import coded_tiers

log = logs.get(__name__)


def _operation_id(route: APIRoute) -> str:
    return route.name


def get_openapi_schema(app: FastAPI) -> dict[str, Any]:
    return get_openapi(
        title=app.title,
        version=app.version,
        summary=app.summary,
        routes=app.routes,
    )


def create_app(settings: Settings) -> FastAPI:
    metrics = ApiMetrics()
    app = FastAPI(
        title="tierpoint",
        summary="Tiered checkpoint storage for large-model training.",
        version="0.1.0",
        lifespan=_lifespan(settings, metrics),
        generate_unique_id_function=_operation_id,
        # Served by api/routers/api_docs.py with assets of its own: FastAPI's pages use a CDN.
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json",
    )
    app.state.metrics = metrics
    _install_openapi(app, settings)
    problems.install(app)
    _include_routes(app)
    # Outermost last: the observer sees every response, including refused oversize bodies.
    app.add_middleware(
        BodySizeLimit,
        max_manifest_bytes=settings.max_manifest_bytes,
        max_request_bytes=settings.max_request_bytes,
        metrics=metrics,
    )
    app.add_middleware(RequestObserver, metrics=metrics)
    _check_gated(app)
    return app


Lifespan = Callable[[FastAPI], AbstractAsyncContextManager[None]]


# The API's catalog connections, every one kept open once opened: with 10 kept and 20 more
# closed when returned, a restart storm's leases started a Postgres backend every ~30 requests
# (a connect of the API's, a fork and cold caches of Postgres') for as long as the storm lasted.
CATALOG_CONNECTIONS = 30
# How long a request waits for one of them before it is answered 503 `catalog_unavailable`.
CATALOG_WAIT = 30.0


def _lifespan(settings: Settings, metrics: ApiMetrics) -> Lifespan:
    """What the API holds while it serves: the catalog engine, the Temporal link, the token
    cache, the catalog gauges' refresher and the metrics listener; all released on shutdown."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = make_async_engine(
            settings.database_url,
            pool_size=CATALOG_CONNECTIONS,
            max_overflow=0,
            pool_timeout=CATALOG_WAIT,
        )
        refresher: asyncio.Task[None] | None = None
        listener: WSGIServer | None = None
        try:
            # Refuses an un-migrated or newer catalog with a message that says what to do.
            await check_schema_async(engine)
            # A coded peer tier this cluster cannot run with is refused here too, saying why.
            if coded_tiers.coded(settings):
                coded_tiers.check(settings, await node_registry.known_count_async(engine))
            temporal = TemporalLink(settings)
            # One attempt now; if Temporal is down the API still serves (and registers).
            await temporal.client(force=True)
            app.state.tierpoint = ApiState(
                settings=settings,
                metrics=metrics,
                engine=engine,
                sessions=async_sessions(engine),
                temporal=temporal,
                tokens=TokenCache(settings.token_cache_seconds),
            )
            if settings.insecure_no_auth:
                log.warning(
                    "AUTHENTICATION IS OFF (insecure_no_auth): every caller may do everything, "
                    "as 'anonymous'. Never run like this on a shared network."
                )
            gauges = CatalogGauges(settings, metrics, app.state.tierpoint.sessions)
            refresher = asyncio.create_task(gauges.run(), name="tierpoint-catalog-gauges")
            if settings.api_metrics_port is not None:
                listener = metrics.serve(settings.api_metrics_port, settings.api_metrics_host)
                app.state.metrics_port = listener.server_port
                log.info(
                    "metrics served",
                    host=settings.api_metrics_host,
                    port=listener.server_port,
                )
            log.info("api ready", tiers=settings.tier_names())
            yield
        finally:
            if listener is not None:
                listener.shutdown()
                listener.server_close()
            if refresher is not None:
                refresher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await refresher
            await engine.dispose()

    return lifespan


def _install_openapi(app: FastAPI, settings: Settings) -> None:
    """The OpenAPI document, built once on first request: problem schemas, the configured tiers
    and the security schemes added to what FastAPI generates."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = problems.add_schemas(get_openapi_schema(app), Manifest)
            schema = openapi_doc.document(schema, settings.tier_names())
            app.openapi_schema = auth.document(schema, app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _include_routes(app: FastAPI) -> None:
    # Before the checkpoints router: its `{job:path}/checkpoints/{step}` must not see `/events`.
    app.include_router(operations.router)
    app.include_router(failures.router)
    app.include_router(actions.router)
    app.include_router(checkpoints.router)
    app.include_router(policies.router)
    app.include_router(retention.router)
    app.include_router(leases.router)
    app.include_router(restores.router)
    app.include_router(pins.router)
    app.include_router(quarantine.router)
    app.include_router(timeline.router)
    app.include_router(deletion.router)
    app.include_router(jobs.router)
    app.include_router(tiers.router)
    app.include_router(integrity.router)
    app.include_router(nodes.router)
    app.include_router(health.router)
    app.include_router(dashboard.router)
    app.mount("/ui", dashboard.assets(), name="ui")
    app.include_router(api_docs.router)
    app.mount(api_docs.ASSETS_URL, api_docs.assets(), name="docs-assets")


def _check_gated(app: FastAPI) -> None:
    # A route of another class would parse its body before it asks for a token (api/gate.py).
    for route in auth.api_routes(app):
        if not isinstance(route.original_route, GatedRoute):
            raise TypeError(
                f"route {route.name} ({route.path_format}) is not a GatedRoute: create its router "
                "with APIRouter(route_class=api.gate.GatedRoute)"
            )
