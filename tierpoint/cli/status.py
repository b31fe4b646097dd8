"""`tierpoint status`: is the stack up, and is the API ready (catalog, Temporal, S3)?"""

from typing import Any

import httpx
from rich.table import Table
from rich.text import Text

from tierpoint.cli.context import ApiUrlOpt, DataDirOpt, console, fail, resolve_api, stack_info
from tierpoint.devstack.facts import DEFAULT_DATA_DIR


def _get(client: httpx.Client, path: str) -> tuple[int | None, Any]:
    try:
        resp = client.get(path)
    except httpx.HTTPError as exc:
        return None, str(exc)
    try:
        return resp.status_code, resp.json()
    except ValueError:
        return resp.status_code, resp.text


def _ok(status: int | None) -> Text:
    if status is None:
        return Text("unreachable", style="bold red")
    return Text(f"{status}", style="green" if status < 400 else "bold red")


def status(api_url: ApiUrlOpt = None, data_dir: DataDirOpt = DEFAULT_DATA_DIR) -> None:
    """Health summary: the dev stack's facts (if any), API liveness and readiness, tiers."""
    info = stack_info(data_dir)
    url, token = resolve_api(api_url, data_dir)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    table = Table(title=f"tierpoint at {url}", title_justify="left")
    table.add_column("check", style="bold")
    table.add_column("status")
    table.add_column("detail", overflow="fold")
    with httpx.Client(base_url=url, headers=headers, timeout=10) as client:
        live, live_body = _get(client, "/healthz")
        ready, ready_body = _get(client, "/readyz")
        tiers_status, tiers = _get(client, "/v1/tiers")
    table.add_row("API /healthz", _ok(live), str(live_body) if live != 200 else "")
    if isinstance(ready_body, dict):
        checks = ready_body.get("checks", ready_body)
        detail = (
            ", ".join(f"{k}: {v}" for k, v in checks.items()) if isinstance(checks, dict) else ""
        )
    else:
        detail = str(ready_body)
    table.add_row("API /readyz", _ok(ready), detail)
    if tiers_status in (401, 403):
        code = tiers.get("code") if isinstance(tiers, dict) else None
        table.add_row(
            "API token", _ok(tiers_status), f"{code}: pass --token or set TIERPOINT_TOKEN"
        )
    if tiers_status == 200 and isinstance(tiers, list):
        for t in tiers:
            where = t.get("root") or f"s3://{t.get('bucket')}/{t.get('prefix') or ''}"
            table.add_row(f"tier {t['name']}", Text(t["kind"]), where)
    if info is not None:
        for node, root in info.nodes.items():
            table.add_row(f"dev node {node}", Text("local"), root)
        table.add_row("dev S3", Text("moto"), f"{info.s3.endpoint_url} bucket {info.s3.bucket}")
    console.print(table)
    if live != 200 or ready != 200:
        fail("the API is not " + ("reachable" if live is None else "ready"))
