"""The operator dashboard at `/`: a static page (HTML, CSS and plain JavaScript in
`api/dashboard/`, no build step) that reads the operator views of this same API. The page holds
no data of its own, so it is served without a token; its API calls carry the token the operator
pastes in (kept in the browser's session storage)."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Depends
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from api.auth import public
from api.gate import GatedRoute

ASSETS = Path(__file__).resolve().parent.parent / "dashboard"
# Only this origin's scripts and styles, no inline code, no framing.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff"}

router = APIRouter(include_in_schema=False, route_class=GatedRoute)


@router.get("/", dependencies=[Depends(public)])
async def dashboard() -> FileResponse:
    return FileResponse(ASSETS / "index.html", headers=HEADERS)


def assets() -> StaticFiles:
    """The page's scripts and styles, mounted at /ui."""
    return StaticFiles(directory=ASSETS)
