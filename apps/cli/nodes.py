"""`tierpoint nodes`: the nodes that reported in, with their failure domain; `tierpoint node-lost
NODE`: an operator declares a node lost."""

from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

import typer
from rich.table import Table
from rich.text import Text

from apps.cli.context import ApiUrlOpt, DataDirOpt, console
from apps.cli.ops_render import ago, print_json
from apps.cli.policy import Api
from apps.cli.render import human_bytes
from apps.devstack.facts import DEFAULT_DATA_DIR


def nodes(
    as_json: Annotated[bool, typer.Option("--json", help="Print the answer as JSON.")] = False,
    api_url: ApiUrlOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR,
) -> None:
    """The nodes whose workers reported in: failure domain, last heartbeat, verified local bytes,
    lost or not."""
    out = Api(api_url, Path(data_dir)).call("GET", "/v1/nodes")
    if as_json:
        print_json(out)
        return
    console.print(nodes_table(out["items"]))


def nodes_table(items: list[dict[str, Any]]) -> Table:
    table = Table(title="nodes")
    for col in ("node", "domain", "last seen", "local bytes", "state"):
        table.add_column(col, justify="right" if col == "local bytes" else "left")
    now = datetime.now(UTC)
    for n in items:
        seen = n["last_seen_at"]
        age = (now - datetime.fromisoformat(seen)).total_seconds() if seen else None
        table.add_row(
            n["id"],
            # No label: placement takes the node for a domain of its own.
            n["failure_domain"] or Text("(own)", style="dim"),
            f"{ago(age)} ago" if age is not None else "never",
            human_bytes(n["local_bytes"]),
            Text("lost", style="bold red") if n["lost_at"] else Text("ok", style="green"),
        )
    return table


def node_lost(
    node: Annotated[str, typer.Argument(help="Node id, as its worker reports in.")],
    api_url: ApiUrlOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR,
) -> None:
    """Declare NODE lost: its local copies become `lost`, checkpoints in flight on it stop waiting
    and finish from the tiers they reached. Safe to repeat. Recorded with the token's name."""
    out = Api(api_url, Path(data_dir)).call("POST", f"/v1/nodes/{quote(node, safe='')}/lost")
    what = "declared lost" if out["changed"] else "was lost already"
    console.print(
        f"node {out['node']} {what} (at {out['lost_at']}): {out['replicas_lost']} local replicas "
        f"lost, {out['markers_failed']} tier copies failed, {out['checkpoints']} checkpoints "
        f"affected, {out['lifecycles_signalled']} running lifecycles told"
    )
    if out["lifecycles_unreachable"]:
        console.print(
            f"[yellow]{out['lifecycles_unreachable']} lifecycles could not be told (Temporal "
            "unreachable): run this again[/]"
        )
