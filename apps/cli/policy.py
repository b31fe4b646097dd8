"""`tierpoint policy list|show|apply|assign|plan`: retention policies through the REST API.

Changes are recorded with the name of the token they were made with as their actor; changing
policies needs an admin token."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.table import Table
from rich.text import Text
from tierpoint_client.transport import ApiTls

from apps.cli.context import (
    ApiUrlOpt,
    DataDirOpt,
    console,
    fail,
    fail_response,
    resolve_api,
)
from apps.cli.render import dollars, human_bytes
from apps.devstack.facts import DEFAULT_DATA_DIR

app = typer.Typer(help="Retention policies: what each tier keeps, per job.", no_args_is_help=True)

TIMEOUT = 30.0


class Api:
    def __init__(self, api_url: str | None, data_dir: Path) -> None:
        url, token = resolve_api(api_url, data_dir)
        headers = {"Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        # No proxies from the environment, as the client library does: the API is on the
        # cluster network.
        self._http = httpx.Client(
            base_url=url,
            headers=headers,
            timeout=TIMEOUT,
            trust_env=False,
            verify=ApiTls.from_env().context(),  # the training client's CA settings
        )

    def call(self, method: str, path: str, body: Any = None, ok: tuple[int, ...] = ()) -> Any:
        """The JSON answer; a problem answer (or no answer) fails the command with its code."""
        try:
            r = self._http.request(method, path, json=body)
        except httpx.HTTPError as exc:
            fail(f"cannot reach the API: {exc}")
        if r.status_code >= 400 and r.status_code not in ok:
            fail_response(r)
        return r.json() if r.content else None


def _spec_text(spec: dict[str, Any]) -> str:
    return json.dumps(spec, indent=2, sort_keys=True)


JsonOpt = Annotated[bool, typer.Option("--json", help="Print the answer as JSON.")]


@app.command("list")
def list_(
    as_json: JsonOpt = False, api_url: ApiUrlOpt = None, data_dir: DataDirOpt = DEFAULT_DATA_DIR
) -> None:
    """The policies in the catalog."""
    page = Api(api_url, data_dir).call("GET", "/v1/policies")
    if as_json:
        print(json.dumps(page, indent=2))
        return
    items = page["items"]
    if not items:
        console.print("no policies (jobs use the built-in default policy)")
        return
    table = Table(title="retention policies")
    for col in ("name", "version", "default", "jobs", "updated"):
        table.add_column(col)
    for p in items:
        table.add_row(
            p["name"],
            str(p["version"]),
            "yes" if p["default"] else "",
            str(p["jobs"]),
            p["updated_at"][:19].replace("T", " "),
        )
    console.print(table)


@app.command("show")
def show(
    name: Annotated[str, typer.Argument(help="Policy name.")],
    as_json: JsonOpt = False,
    api_url: ApiUrlOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR,
) -> None:
    """A policy's document, and its history of changes."""
    api = Api(api_url, data_dir)
    p = api.call("GET", f"/v1/policies/{name}")
    if as_json:
        history = api.call("GET", f"/v1/policies/{name}/history")
        print(json.dumps({"policy": p, "history": history["items"]}, indent=2))
        return
    default = ", default" if p["default"] else ""
    console.print(f"[bold]{p['name']}[/] version {p['version']}{default}, {p['jobs']} job(s)")
    console.print(_spec_text(p["spec"]), markup=False, highlight=False)
    history = api.call("GET", f"/v1/policies/{name}/history")["items"]
    if history:
        table = Table(title="history")
        for col in ("when", "actor", "action", "version", "job"):
            table.add_column(col)
        for h in history:
            d = h["detail"]
            table.add_row(
                h["at"][:19].replace("T", " "),
                h["actor"] or "",
                str(d.get("action", "")),
                str(d.get("version") or ""),
                h["job"] or "",
            )
        console.print(table)


@app.command("apply")
def apply(
    name: Annotated[str, typer.Argument(help="Policy name.")],
    file: Annotated[
        Path, typer.Argument(help="The policy document (JSON).", exists=True, dir_okay=False)
    ],
    default: Annotated[bool, typer.Option("--default", help="Make it the default policy.")] = False,
    api_url: ApiUrlOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR,
) -> None:
    """Create the policy, or revise it (a different document is a new version)."""
    try:
        spec = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        fail(f"{file}: not a JSON document: {exc}")
    api = Api(api_url, data_dir)
    body: dict[str, Any] = {"name": name, "spec": spec, "default": default}
    created = api.call("POST", "/v1/policies", body, ok=(409,))
    if created.get("code") == "policy_exists":
        update: dict[str, Any] = {"spec": spec}
        if default:
            update["default"] = True
        p = api.call("PUT", f"/v1/policies/{name}", update)
        console.print(f"policy [bold]{name}[/] is at version {p['version']}")
    else:
        console.print(f"policy [bold]{name}[/] created (version 1)")


@app.command("assign")
def assign(
    job: Annotated[str, typer.Argument(help="Job name.")],
    name: Annotated[str, typer.Argument(help="Policy name, or 'default' for the default policy.")],
    api_url: ApiUrlOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR,
) -> None:
    """Assign a policy to a job (`default`: the job follows the default policy)."""
    policy = None if name == "default" else name
    r = Api(api_url, data_dir).call("PUT", f"/v1/jobs/{job}/policy", {"policy": policy})
    console.print(f"job [bold]{job}[/] uses {r['name']} version {r['version']} ({r['source']})")


def _plan_tables(body: dict[str, Any]) -> list[Table]:
    plan = body["plan"]
    expiries = Table(title=f"would expire now ({len(plan['expiries'])})")
    for col in ("tier", "step", "bytes", "rule", "why"):
        expiries.add_column(col)
    for e in plan["expiries"]:
        expiries.add_row(
            e["tier"],
            str(e["step"]),
            human_bytes(e["bytes"]),
            Text(e["rule"], style="magenta"),
            e["reason"],
        )
    for u in plan["unfinished"]:
        expiries.add_row(
            u["tier"],
            str(u["step"]),
            human_bytes(u["bytes"]),
            Text("unfinished", style="dim"),
            "already expiring; the executor finishes it",
        )
    keeps = Table(title=f"kept ({len(plan['keeps'])})")
    for col in ("tier", "step", "bytes", "reasons"):
        keeps.add_column(col)
    for k in plan["keeps"]:
        keeps.add_row(k["tier"], str(k["step"]), human_bytes(k["bytes"]), ", ".join(k["reasons"]))
    cost = {c["tier"]: c for c in body["cost"]["tiers"]}
    usage = Table(title="usage per tier")
    for col in ("tier", "now", "after", "$/month now", "$/month after", "quota", "rules"):
        usage.add_column(col, justify="right" if col.startswith("$") else "left")
    for u in plan["usage"]:
        quota = "-" if u["max_bytes"] is None else human_bytes(u["max_bytes"])
        if u["quota_met"] is False:
            quota += f" (over by {human_bytes(u['over_by'])})"
        c = cost[u["tier"]]
        usage.add_row(
            u["tier"],
            human_bytes(u["bytes_now"]),
            human_bytes(u["bytes_after"]),
            dollars(c["monthly_cost_now"]),
            dollars(c["monthly_cost_after"]),
            quota,
            u["rule"],
        )
    return [expiries, keeps, usage]


@app.command("plan")
def plan(
    job: Annotated[str, typer.Argument(help="Job name.")],
    preview: Annotated[
        Path | None,
        typer.Option(
            "--policy", help="Preview this policy document (JSON) instead.", dir_okay=False
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON.")] = False,
    api_url: ApiUrlOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR,
) -> None:
    """Dry run: what retention would expire now, where and why; what stays and why; usage."""
    body: dict[str, Any] = {}
    if preview is not None:
        try:
            body["policy"] = json.loads(preview.read_text())
        except (OSError, ValueError) as exc:
            fail(f"{preview}: not a JSON document: {exc}")
    r = Api(api_url, data_dir).call("POST", f"/v1/jobs/{job}/retention/plan", body)
    if as_json:
        console.print_json(data=r)
        return
    p = r["policy"]
    label = "previewed policy" if p["source"] == "preview" else f"{p['name']} v{p['version']}"
    console.print(f"job [bold]{job}[/], {label} ({p['source']}), at {r['plan']['now']}")
    for table in _plan_tables(r):
        console.print(table)
    total = r["cost"]
    console.print(
        f"monthly cost: {dollars(total['monthly_cost_now'])} now, "
        f"{dollars(total['monthly_cost_after'])} after these expiries"
    )
    compared = r.get("compared_to_current")
    if compared is not None:
        delta = compared["monthly_cost_delta"]
        style = "green" if delta < 0 else "red" if delta > 0 else "dim"
        current = dollars(compared["current_policy_monthly_cost_after"])
        sign = "+" if delta > 0 else ""
        console.print(
            f"against the job's own policy ({current} after its expiries): "
            f"[{style}]{sign}{dollars(delta)}[/] a month"
        )
    for note in r["plan"]["notes"]:
        console.print(f"[yellow]note:[/] {note}")
