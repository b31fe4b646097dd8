"""The API's reference pages, `/docs` (Swagger UI) and `/redoc` (ReDoc), with every script,
style sheet and icon served by the API itself: GPU clusters are often air-gapped, and FastAPI's
own pages load Swagger UI and ReDoc from a CDN (a blank page without internet).

The assets are the ones the `fastapi-standalone-docs` distribution ships (Swagger UI 5, a ReDoc 2
build that asks for its logo next to the page instead of a CDN); the pages are FastAPI's own HTML
pointed at them, so they follow FastAPI's upgrades. (The distribution's own wiring, which patches
FastAPI's functions process-wide, is not used: these routes are gated like every other.) Like the
dashboard, the pages hold no data and are served without a token; the OpenAPI document they
render is public too."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import APIRouter, Depends, Request
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import FileResponse, HTMLResponse
from fastapi.staticfiles import StaticFiles

from api.auth import public
from api.gate import GatedRoute

DOCS = "/docs"
REDOC = "/redoc"
OAUTH2_REDIRECT = "/docs/oauth2-redirect"
# Where the assets are mounted (app.py).
ASSETS_URL = "/docs-assets"
ASSETS = Path(str(files("fastapi_standalone_docs") / "static"))
# ReDoc's side menu shows this logo, fetched relative to the page's own path.
REDOC_LOGO = f"{REDOC}/logo-mini.svg"
TITLE = "tierpoint"

router = APIRouter(include_in_schema=False, route_class=GatedRoute)


def _root(request: Request) -> str:
    # Behind a proxy that serves the API under a prefix, every URL of the page carries it.
    return str(request.scope.get("root_path", ""))


@router.get(DOCS, dependencies=[Depends(public)])
async def swagger_ui(request: Request) -> HTMLResponse:
    root = _root(request)
    return get_swagger_ui_html(
        openapi_url=f"{root}/openapi.json",
        title=f"{TITLE} - Swagger UI",
        oauth2_redirect_url=f"{root}{OAUTH2_REDIRECT}",
        swagger_js_url=f"{root}{ASSETS_URL}/swagger/swagger-ui-bundle.js",
        swagger_css_url=f"{root}{ASSETS_URL}/swagger/swagger-ui.css",
        swagger_favicon_url=f"{root}{ASSETS_URL}/fastapi/favicon.png",
    )


@router.get(OAUTH2_REDIRECT, dependencies=[Depends(public)])
async def swagger_ui_redirect() -> HTMLResponse:
    return get_swagger_ui_oauth2_redirect_html()


@router.get(REDOC, dependencies=[Depends(public)])
async def redoc(request: Request) -> HTMLResponse:
    root = _root(request)
    return get_redoc_html(
        openapi_url=f"{root}/openapi.json",
        title=f"{TITLE} - ReDoc",
        redoc_js_url=f"{root}{ASSETS_URL}/redoc/redoc.standalone.js",
        redoc_favicon_url=f"{root}{ASSETS_URL}/fastapi/favicon.png",
        # Google's fonts are one more thing an air-gapped cluster cannot fetch.
        with_google_fonts=False,
    )


@router.get(REDOC_LOGO, dependencies=[Depends(public)])
async def redoc_logo() -> FileResponse:
    return FileResponse(ASSETS / "redoc" / "logo-mini.svg")


def assets() -> StaticFiles:
    """Swagger UI's and ReDoc's scripts, styles and the favicon, mounted at ASSETS_URL."""
    return StaticFiles(directory=ASSETS)
