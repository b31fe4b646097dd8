"""`tierpoint checkpoints list|show`: a job's checkpoints and where each one lives."""

from typing import Annotated

import typer

from tierpoint.cli.context import ApiUrlOpt, DataDirOpt, api_errors, console, make_client
from tierpoint.cli.render import checkpoint_detail, checkpoints_table
from tierpoint.devstack.facts import DEFAULT_DATA_DIR

app = typer.Typer(help="A job's checkpoints: state per tier, shards and replicas.")


@app.command("list")
def list_(
    job: Annotated[str, typer.Argument(help="Job name.")],
    state: Annotated[
        str | None, typer.Option(help="Only checkpoints in this state (on --tier, if given).")
    ] = None,
    tier: Annotated[str | None, typer.Option(help="Tier that --state refers to.")] = None,
    limit: Annotated[int, typer.Option(help="Show at most this many (newest first).")] = 50,
    api_url: ApiUrlOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR,
) -> None:
    """List a job's checkpoints with their state on every tier."""
    client = make_client(api_url, data_dir)
    with api_errors():
        tiers = [t.name for t in client.tiers()]
        items = []
        for cp in client.checkpoints(job, state=state, tier=tier):
            items.append(cp)
            if len(items) >= limit:
                break
    if not items:
        console.print(f"no checkpoints for job {job!r}" + (f" in state {state}" if state else ""))
        return
    console.print(checkpoints_table(job, items, tiers))


@app.command("show")
def show(
    job: Annotated[str, typer.Argument(help="Job name.")],
    step: Annotated[int, typer.Argument(help="Checkpoint step.")],
    api_url: ApiUrlOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR,
) -> None:
    """One checkpoint: per-tier state and progress, every shard with its replicas."""
    client = make_client(api_url, data_dir)
    with api_errors():
        cp = client.checkpoint(job, step)
    console.print(checkpoint_detail(cp))
