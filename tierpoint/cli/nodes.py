"""`tierpoint node-lost NODE`: an operator declares a node lost."""

from typing import Annotated

import typer

from tierpoint.cli.context import ApiUrlOpt, DataDirOpt, api_errors, console, make_client
from tierpoint.devstack.facts import DEFAULT_DATA_DIR


def node_lost(
    node: Annotated[str, typer.Argument(help="Node id, as its worker reports in.")],
    api_url: ApiUrlOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR,
) -> None:
    """Declare NODE lost: its local copies become `lost`, checkpoints in flight on it stop waiting
    and finish from the tiers they reached. Safe to repeat."""
    client = make_client(api_url, data_dir)
    with api_errors():
        out = client.declare_node_lost(node)
    what = "declared lost" if out["changed"] else "was lost already"
    console.print(
        f"node {out['node']} {what} (at {out['lost_at']}): {out['replicas_lost']} local replicas "
        f"lost, {out['markers_failed']} local markers failed, {out['checkpoints']} checkpoints "
        f"affected, {out['lifecycles_signalled']} running lifecycles told"
    )
    if out["lifecycles_unreachable"]:
        console.print(
            f"[yellow]{out['lifecycles_unreachable']} lifecycles could not be told (Temporal "
            "unreachable): run this again[/]"
        )
