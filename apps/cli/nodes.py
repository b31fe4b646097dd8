"""`tierpoint node-lost NODE`: an operator declares a node lost."""

from pathlib import Path
from typing import Annotated
from urllib.parse import quote

import typer

from apps.cli.context import ApiUrlOpt, DataDirOpt, console
from apps.cli.policy import Api
from apps.devstack.facts import DEFAULT_DATA_DIR


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
        f"lost, {out['markers_failed']} local markers failed, {out['checkpoints']} checkpoints "
        f"affected, {out['lifecycles_signalled']} running lifecycles told"
    )
    if out["lifecycles_unreachable"]:
        console.print(
            f"[yellow]{out['lifecycles_unreachable']} lifecycles could not be told (Temporal "
            "unreachable): run this again[/]"
        )
