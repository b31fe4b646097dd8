"""`tierpoint status`: is the API up and ready (catalog, Temporal, S3), and the operator's one
screen: jobs with their recovery point per tier, copies in flight, failures, tiers."""

from typing import Annotated, Any

import httpx
import typer
from rich.text import Text
from tierpoint_client.transport import ApiTls

from apps.cli import ops_status
from apps.cli.context import ApiUrlOpt, DataDirOpt, console, fail, resolve_api, stack_info
from apps.cli.ops_render import print_json
from apps.devstack.facts import DEFAULT_DATA_DIR


def _get(client: httpx.Client, path: str) -> tuple[int | None, Any]:
    try:
        resp = client.get(path)
    except httpx.HTTPError as exc:
        return None, str(exc)
    try:
        return resp.status_code, resp.json()
    except ValueError:
        return resp.status_code, resp.text


def _ok(name: str, status: int | None) -> Text:
    if status is None:
        return Text(f"{name} unreachable", style="bold red")
    return Text(f"{name} {status}", style="green" if status < 400 else "bold red")


def _checks(body: Any) -> str:
    if isinstance(body, dict):
        checks = body.get("checks", body)
        if isinstance(checks, dict):
            return ", ".join(f"{k}: {v}" for k, v in checks.items())
    return str(body)


def status(
    job: Annotated[
        str | None, typer.Option(help="Only this job: its row, copies in flight and failures.")
    ] = None,
    jobs: Annotated[int, typer.Option(min=1, max=500, help="Show at most this many jobs.")] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="Print the answers as JSON.")] = False,
    api_url: ApiUrlOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR,
) -> None:
    """One screen: health, jobs' recovery points, copies in flight, failures, tiers."""
    info = stack_info(data_dir)
    url, token = resolve_api(api_url, data_dir)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    verify = ApiTls.from_env().context()  # an https API's CA, as the training client trusts it
    with httpx.Client(
        base_url=url, headers=headers, timeout=10, trust_env=False, verify=verify
    ) as client:
        healthz, healthz_body = _get(client, "/healthz")
        ready, ready_body = _get(client, "/readyz")
        views, problems = ops_status.fetch(client, jobs, job) if healthz == 200 else ({}, [])
    if as_json:
        print_json(
            {
                "api_url": url,
                "healthz": {"status": healthz, "body": healthz_body},
                "readyz": {"status": ready, "body": ready_body},
                **views,
                "problems": problems,
            }
        )
    else:
        line = Text.assemble(
            (f"tierpoint at {url}: ", "bold"),
            _ok("API /healthz", healthz),
            "  ",
            _ok("API /readyz", ready),
        )
        if ready is not None:
            line.append(f" ({_checks(ready_body)})", style="dim")
        console.print(line)
        if info is not None:
            nodes = ", ".join(info.nodes)
            console.print(f"dev stack: nodes {nodes}; S3 {info.s3.endpoint_url}", style="dim")
        for p in problems:
            console.print(Text(p, style="bold red"))
        console.print(ops_status.render(views))
    if healthz != 200 or ready != 200:
        fail("the API is not " + ("reachable" if healthz is None else "ready"))
