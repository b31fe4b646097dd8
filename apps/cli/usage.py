"""`tierpoint usage JOB`: bytes and monthly storage cost per tier, now and after the expiries
retention has planned, through the REST API."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from apps.cli.context import ApiUrlOpt, DataDirOpt, console
from apps.cli.policy import Api
from apps.cli.render import dollars, human_bytes
from apps.devstack.facts import DEFAULT_DATA_DIR


def usage(
    job: Annotated[str, typer.Argument(help="Job name.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the answer as JSON.")] = False,
    api_url: ApiUrlOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR,
) -> None:
    """Bytes, checkpoints and monthly cost per tier for JOB, now and after planned expiries."""
    r = Api(api_url, data_dir).call("GET", f"/v1/jobs/{job}/usage")
    if as_json:
        console.print_json(data=r)
        return
    p = r["policy"]
    policy = f"policy {p['name']} v{p['version']}, {p['source']}"
    table = Table(title=f"{job}: usage per tier ({policy})")
    for col in ("tier", "kind", "checkpoints", "bytes now", "after", "$/GB-month"):
        table.add_column(col)
    for col in ("$/month now", "$/month after"):
        table.add_column(col, justify="right")
    for t in r["tiers"]:
        table.add_row(
            t["tier"],
            t["kind"],
            f"{t['checkpoints_now']} -> {t['checkpoints_after']}",
            human_bytes(t["bytes_now"]),
            human_bytes(t["bytes_after"]),
            f"{t['price_per_gb_month']:g}",
            dollars(t["monthly_cost_now"]),
            dollars(t["monthly_cost_after"]),
        )
    table.add_section()
    now, after = dollars(r["monthly_cost_now"]), dollars(r["monthly_cost_after"])
    table.add_row("total", "", "", "", "", "", now, after)
    console.print(table)
