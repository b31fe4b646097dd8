"""`tierpoint show JOB STEP` (also `tierpoint checkpoints show`): one checkpoint at a glance: its
tiers with state, progress and replicas by state, what happened to it (its events, latest last),
with `--shards` every shard with its replicas, and with `--stripes` every stripe of its coded
copies (holder and state per index)."""

from __future__ import annotations

import json
from typing import Annotated, Any
from urllib.parse import quote, urlencode

import typer
from rich.text import Text

from apps.cli.context import ApiUrlOpt, DataDirOpt, console
from apps.cli.ops_render import (
    checkpoint_tiers_table,
    events_table,
    print_json,
    shards_table,
    stamp,
    stripes_table,
)
from apps.cli.policy import Api
from apps.cli.render import human_bytes
from apps.devstack.facts import DEFAULT_DATA_DIR

JobArg = Annotated[str, typer.Argument(help="Job name.")]
StepArg = Annotated[int, typer.Argument(min=0, help="Checkpoint step.")]
# Events read at most (pages of PAGE): a checkpoint's history is short unless it flaps.
MAX_EVENTS = 2000
PAGE = 500


def checkpoint_path(job: str, step: int) -> str:
    return f"/v1/jobs/{quote(job, safe='')}/checkpoints/{step}"


def all_events(api: Api, job: str, step: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    cursor: str | None = None
    while len(out) < MAX_EVENTS:
        params: dict[str, str | int] = {"limit": PAGE}
        if cursor is not None:
            params["cursor"] = cursor
        page = api.call("GET", f"{checkpoint_path(job, step)}/events?{urlencode(params)}")
        out.extend(page["items"])
        cursor = page["next_cursor"]
        if cursor is None:
            break
    return out


def all_stripes(api: Api, job: str, step: int, tier: str) -> list[dict[str, Any]]:
    """Every shard of the checkpoint with its stripes on `tier`, page by page."""
    out: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        params: dict[str, str | int] = {"limit": PAGE}
        if cursor is not None:
            params["cursor"] = cursor
        path = f"{checkpoint_path(job, step)}/tiers/{quote(tier, safe='')}/stripes"
        page = api.call("GET", f"{path}?{urlencode(params)}")
        out.extend(page["items"])
        cursor = page["next_cursor"]
        if cursor is None:
            return out


def show(
    job: JobArg,
    step: StepArg,
    events: Annotated[
        int, typer.Option("--events", min=0, help="Show the latest this many events.")
    ] = 30,
    shards: Annotated[
        bool, typer.Option("--shards", help="Also every shard with its replicas per tier.")
    ] = False,
    stripes: Annotated[
        bool,
        typer.Option("--stripes", help="Also every stripe of its coded copies: holder, state."),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the answers as JSON.")] = False,
    api_url: ApiUrlOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR,
) -> None:
    """One checkpoint: its tiers (state, progress, replicas, why not), events, shards."""
    api = Api(api_url, data_dir)
    cp = api.call("GET", checkpoint_path(job, step))
    history = all_events(api, job, step)
    # A coded copy is one whose tier copy has a coverage.
    coded = [t["tier"] for t in cp["tiers"] if t.get("coverage")] if stripes else []
    held = {tier: all_stripes(api, job, step, tier) for tier in coded}
    if as_json:
        print_json({"checkpoint": cp, "events": history, **({"stripes": held} if stripes else {})})
        return
    head = Text.assemble(
        (f"{cp['job']} ", "bold"),
        (f"step {cp['step']}", "bold cyan"),
        f"  {human_bytes(cp['total_bytes'])} in {cp['shard_count']} shards,"
        f" registered {stamp(cp['created_at'])}",
    )
    if cp["pinned"]:
        head.append("  pinned", style="bold")
    if cp["quarantine_reason"]:
        head.append(f"  quarantined: {cp['quarantine_reason']}", style="bold red")
    if cp.get("deleted_at"):
        head.append(f"  deleted {stamp(cp['deleted_at'])}", style="bold red")
    console.print(head)
    if cp.get("metadata"):
        console.print(Text(f"metadata: {json.dumps(cp['metadata'])}", style="dim"))
    console.print(checkpoint_tiers_table(cp))
    if shards:
        console.print(shards_table(cp))
    for tier, listed in held.items():
        console.print(stripes_table(cp, tier, listed))
    shown = history[-events:] if events else []
    title = f"events ({len(shown)} of {len(history)}, latest last)"
    console.print(events_table(shown, title))
