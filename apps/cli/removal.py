"""`tierpoint failures ack JOB STEP` (an operator clears a failure that needs no retry) and
`tierpoint delete JOB [STEP]` (an admin removes a checkpoint, or all of a job's, through
retention's expiry). Both are recorded by the API with the token's name."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import quote

import typer

from apps.cli.actions import JsonOpt
from apps.cli.context import ApiUrlOpt, DataDirOpt, console
from apps.cli.ops_render import print_json
from apps.cli.policy import Api
from apps.cli.show import JobArg, StepArg, checkpoint_path
from apps.devstack.facts import DEFAULT_DATA_DIR

failures = typer.Typer(help="Failed copies: acknowledge the ones that need no retry.")


@failures.command("ack")
def ack(
    job: JobArg,
    step: StepArg,
    tier: Annotated[
        str | None, typer.Option(help="Only the failure on this tier (default: every tier).")
    ] = None,
    as_json: JsonOpt = False,
    api_url: ApiUrlOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR,
) -> None:
    """Acknowledge a checkpoint's failed copies: they leave the failures view and stay in its
    history. Nothing is copied or deleted; a retry or a new failure shows it again."""
    body = {"tier": tier} if tier is not None else None
    r = Api(api_url, data_dir).call("POST", f"{checkpoint_path(job, step)}/acknowledge", body)
    if as_json:
        print_json(r)
        return
    for t, reason in r["acknowledged"].items():
        console.print(f"acknowledged {job} step {step} on {t}: {reason or 'no reason recorded'}")


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
