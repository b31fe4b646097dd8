"""`tierpoint checkpoints JOB` (the same as `checkpoints list JOB`) and `checkpoints show JOB
STEP` (the same as `tierpoint show JOB STEP`): a job's checkpoints and where each one lives."""

from typing import Annotated, Any
from urllib.parse import quote, urlencode

import typer
from typer.core import TyperGroup

from apps.cli import show as show_cmd
from apps.cli.context import ApiUrlOpt, DataDirOpt, api_errors, console, make_client
from apps.cli.ops_render import print_json
from apps.cli.policy import Api
from apps.cli.render import checkpoints_table
from apps.devstack.facts import DEFAULT_DATA_DIR


class ListByDefault(TyperGroup):
    """`checkpoints JOB ...` runs `checkpoints list JOB ...`: a first argument that is neither a
    subcommand nor an option is a job name (a job named `list` or `show` needs `list` first)."""

    # Any: typer types the context with its vendored click, which it does not export.
    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if args and not args[0].startswith("-") and args[0] not in self.commands:
            args = ["list", *args]
        return super().parse_args(ctx, args)


app = typer.Typer(
    cls=ListByDefault,
    help="A job's checkpoints: state per tier, shards and replicas. "
    "`tierpoint checkpoints JOB` lists them.",
)


def _json_list(
    api_url: str | None, data_dir: Any, job: str, state: str | None, tier: str | None, limit: int
) -> None:
    api = Api(api_url, data_dir)
    items: list[dict[str, Any]] = []
    cursor: str | None = None
    while len(items) < limit:
        params: dict[str, str | int] = {"limit": min(limit - len(items), 500)}
        params |= {k: v for k, v in (("state", state), ("tier", tier), ("cursor", cursor)) if v}
        page = api.call("GET", f"/v1/jobs/{quote(job, safe='')}/checkpoints?{urlencode(params)}")
        items.extend(page["items"])
        cursor = page["next_cursor"]
        if cursor is None:
            break
    print_json({"items": items[:limit]})


@app.command("list")
def list_(
    job: Annotated[str, typer.Argument(help="Job name.")],
    state: Annotated[
        str | None, typer.Option(help="Only checkpoints in this state (on --tier, if given).")
    ] = None,
    tier: Annotated[str | None, typer.Option(help="Tier that --state refers to.")] = None,
    limit: Annotated[int, typer.Option(help="Show at most this many (newest first).")] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="Print the answer as JSON.")] = False,
    api_url: ApiUrlOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR,
) -> None:
    """List a job's checkpoints with their state on every tier."""
    if as_json:
        _json_list(api_url, data_dir, job, state, tier, limit)
        return
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


# One implementation of "one checkpoint": `tierpoint show` (tiers, events, shards with --shards).
app.command("show")(show_cmd.show)
