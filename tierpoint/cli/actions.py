"""Operator actions on one checkpoint: `tierpoint retry`, `verify`, `pin` and `unpin`. Each is
recorded by the API with the token's name as its actor; doing one twice does no more."""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer
from rich.text import Text

from tierpoint.cli.context import ApiUrlOpt, DataDirOpt, console, fail
from tierpoint.cli.ops_render import print_json
from tierpoint.cli.policy import Api
from tierpoint.cli.render import human_bytes
from tierpoint.cli.show import JobArg, StepArg, checkpoint_path
from tierpoint.devstack.facts import DEFAULT_DATA_DIR

JsonOpt = Annotated[bool, typer.Option("--json", help="Print the answer as JSON.")]
# Asking again while a verification runs joins it: this is how often the command asks.
VERIFY_POLL = 1.0


def retry(
    job: JobArg,
    step: StepArg,
    as_json: JsonOpt = False,
    api_url: ApiUrlOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR,
) -> None:
    """Copy a checkpoint's failed tiers again (a new lifecycle run; verified copies are kept)."""
    r = Api(api_url, data_dir).call("POST", f"{checkpoint_path(job, step)}/retry")
    if as_json:
        print_json(r)
        return
    console.print(
        f"retrying {job} step {step} on {', '.join(r['tiers'])}: run {r['workflow_id']} "
        f"(attempt {r['attempt']}); follow it with `tierpoint watch {job}`"
    )


def _outcome(r: dict[str, Any]) -> Text:
    o = r["outcome"]
    line = Text(f"{r['job']} step {r['step']} on {r['tier']}: read {o['read']}, ")
    line.append(f"{o['good']} good", style="green")
    bad = o["corrupt"] + o["lost"]
    line.append(", ")
    line.append(f"{o['corrupt']} corrupt, {o['lost']} lost", style="bold red" if bad else "green")
    line.append(f" ({human_bytes(o['bytes'])} read good)", style="dim")
    if o["skipped"]:
        line.append(f", {o['skipped']} skipped (no longer verified)", style="dim")
    if o["repair_requested"]:
        line.append("\nthe tier left restorable; repair started", style="yellow")
    for p in o["problems"]:
        line.append(f"\n  {p}", style="red")
    return line


def verify(
    job: JobArg,
    step: StepArg,
    tier: Annotated[str, typer.Option(help="The tier whose copy to read back.")],
    wait: Annotated[
        float, typer.Option(min=0, help="Wait this many seconds for the outcome (0: do not).")
    ] = 600,
    as_json: JsonOpt = False,
    api_url: ApiUrlOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR,
) -> None:
    """Read a checkpoint's copy on TIER back now and compare every checksum.

    A replica that reads back wrong is marked corrupt, the tier leaves restorable at once and a
    repair copies it back from another tier."""
    api = Api(api_url, data_dir)
    path = f"{checkpoint_path(job, step)}/verify"
    deadline = time.monotonic() + wait
    r = api.call("POST", path, {"tier": tier})
    joined = r["joined"]
    with console.status(f"reading {job} step {step} back from {tier}", spinner="dots"):
        while r["status"] == "running" and time.monotonic() < deadline:
            time.sleep(VERIFY_POLL)
            r = api.call("POST", path, {"tier": tier})  # joins the same run
    r["joined"] = joined
    if as_json:
        print_json(r)
    elif r["status"] == "running":
        console.print(f"still reading (run {r['workflow_id']}); `tierpoint show {job} {step}`")
    elif r["status"] == "completed":
        console.print(_outcome(r))
    if r["status"] == "failed":
        fail(f"verification_failed: {r.get('error') or 'the run failed'}")


def _pin(job: str, step: int, on: bool, as_json: bool, api_url: str | None, data_dir: Any) -> None:
    r = Api(api_url, data_dir).call("PUT" if on else "DELETE", f"{checkpoint_path(job, step)}/pin")
    if as_json:
        print_json(r)
        return
    word = "pinned" if on else "unpinned"
    already = "" if r.get("changed", True) else " (it already was)"
    console.print(f"{word} {job} step {step}{already}")


def pin(
    job: JobArg,
    step: StepArg,
    as_json: JsonOpt = False,
    api_url: ApiUrlOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR,
) -> None:
    """Pin a checkpoint: no tier ever expires it, whatever the policy or quota."""
    _pin(job, step, True, as_json, api_url, data_dir)


def unpin(
    job: JobArg,
    step: StepArg,
    as_json: JsonOpt = False,
    api_url: ApiUrlOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR,
) -> None:
    """Unpin a checkpoint: the job's policy decides again."""
    _pin(job, step, False, as_json, api_url, data_dir)
