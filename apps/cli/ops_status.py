"""The operator's one screen under `tierpoint status`: jobs with their recovery point per tier,
copies in flight with progress, failures, and tier usage, read from the operator views."""

from __future__ import annotations

from typing import Any

import httpx
from rich.console import Group, RenderableType
from rich.text import Text

from apps.cli.context import fail_response
from apps.cli.ops_render import (
    acknowledge_hint,
    failures_table,
    in_flight_table,
    jobs_table,
    usage_table,
)

# The views' paths and the keys they go under in `status --json`.
VIEWS = {
    "jobs": "/v1/overview/jobs",
    "in_flight": "/v1/copies/in-flight",
    "failures": "/v1/failures",
    "tiers_usage": "/v1/tiers/usage",
}


def fetch(client: httpx.Client, jobs: int, job: str | None) -> tuple[dict[str, Any], list[str]]:
    """The views' answers by key, and one line per view that could not be read (its problem's
    code and detail): a view the token may not read leaves the others on the screen. A token
    the API does not accept at all (401) fails the command."""
    out: dict[str, Any] = {}
    problems: list[str] = []
    for key, path in VIEWS.items():
        params: dict[str, str | int] = {"limit": jobs if key == "jobs" else 20}
        if job is not None:
            # The exact job in every view: a prefix here and a name below counted other jobs'
            # failures in the job's row.
            params["job"] = job
        if key == "tiers_usage":
            params = {}
        try:
            r = client.get(path, params=params)
        except httpx.HTTPError as exc:
            problems.append(f"{path}: {exc}")
            continue
        if r.status_code == 401:
            # A token the API refuses fails every view alike: the command fails, in one line.
            fail_response(r)
        body = r.json() if r.headers.get("content-type", "").endswith("json") else None
        if r.status_code != 200 or not isinstance(body, dict):
            code = body.get("code") if isinstance(body, dict) else r.status_code
            detail = body.get("detail") if isinstance(body, dict) else r.text[:200]
            problems.append(f"{path}: {code}: {detail}")
            continue
        out[key] = body
    return out, problems


def render(views: dict[str, Any]) -> RenderableType:
    parts: list[RenderableType] = []
    if "jobs" in views:
        jobs = views["jobs"]
        parts.append(jobs_table(jobs) if jobs["items"] else Text("no jobs yet", style="dim"))
    if "in_flight" in views:
        flights = views["in_flight"]
        parts.append(
            in_flight_table(flights) if flights["items"] else Text("nothing in flight", style="dim")
        )
    if "failures" in views:
        failures = views["failures"]
        parts.append(
            failures_table(failures) if failures["items"] else Text("no failures", style="green")
        )
        hint = acknowledge_hint(failures)
        if hint is not None:
            parts.append(hint)
    if "tiers_usage" in views:
        parts.append(usage_table(views["tiers_usage"]))
    return Group(*parts)
