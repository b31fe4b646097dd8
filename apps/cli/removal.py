"""`tierpoint delete JOB [STEP]`: an admin removes a checkpoint, or all of a job's, through
retention's expiry, recorded by the API with the token's name. (Failures an operator clears
are `tierpoint failures ack`, in failures.py.)"""

from __future__ import annotations

from typing import Annotated
from urllib.parse import quote

import typer

from apps.cli.actions import JsonOpt
from apps.cli.context import ApiUrlOpt, DataDirOpt, console
from apps.cli.ops_render import print_json
from apps.cli.policy import Api
from apps.cli.show import JobArg, checkpoint_path
from apps.devstack.facts import DEFAULT_DATA_DIR


def delete(
    job: JobArg,
    step: Annotated[
        int | None, typer.Argument(min=0, help="Checkpoint step (omitted: every checkpoint).")
    ] = None,
    force: Annotated[
        bool,
        typer.Option(help="Delete even if pinned, held by a restore lease or in flight."),
    ] = False,
    as_json: JsonOpt = False,
    api_url: ApiUrlOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR,
) -> None:
    """Delete a checkpoint (or every checkpoint of JOB): "latest" stops offering it now and
    retention's expiry deletes every copy next. Needs an admin token."""
    path = checkpoint_path(job, step) if step is not None else f"/v1/jobs/{quote(job, safe='')}"
    r = Api(api_url, data_dir).call("DELETE", path + ("?force=true" if force else ""))
    if as_json:
        print_json(r)
        return
    for d in r["deleted"]:
        where = ", ".join(d["tiers"]) or "no tier"
        over = f" (overriding: {', '.join(d['overrode'])})" if d["overrode"] else ""
        console.print(f"deleted {job} step {d['step']}: expiring on {where}{over}")
    for s in r["already_deleted"]:
        console.print(f"{job} step {s} was deleted already", style="dim")
    if not r["deleted"] and not r["already_deleted"]:
        console.print(f"{job} has no checkpoints", style="dim")
