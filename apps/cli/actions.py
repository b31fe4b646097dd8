"""Operator actions on one checkpoint: `tierpoint retry`, `verify`, `pin` and `unpin`. Each is
recorded by the API with the token's name as its actor; doing one twice does no more."""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer
from rich.text import Text

from apps.cli.context import DAMAGE_FOUND, ApiUrlOpt, DataDirOpt, console, fail
from apps.cli.ops_render import print_json
from apps.cli.policy import Api
from apps.cli.render import human_bytes
from apps.cli.show import JobArg, StepArg, checkpoint_path
from apps.devstack.facts import DEFAULT_DATA_DIR

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


def _verify_one(api: Api, job: str, step: int, tier: str, wait: float) -> dict[str, Any] | None:
    """One tier's verification, followed until it ends or `wait` runs out; None when the tier
    holds no verified copy to read (nothing_to_verify)."""
    path = f"{checkpoint_path(job, step)}/verify"
    deadline = time.monotonic() + wait
    r: dict[str, Any] = api.call("POST", path, {"tier": tier}, ok=(409,))
    if r.get("code") == "nothing_to_verify":
        return None
    if "joined" not in r:  # another 409
        fail(f"{r.get('detail')} (409 {r.get('code')})")
    joined = r["joined"]
    with console.status(f"reading {job} step {step} back from {tier}", spinner="dots"):
        while r["status"] == "running" and time.monotonic() < deadline:
            time.sleep(VERIFY_POLL)
            r = api.call("POST", path, {"tier": tier})  # joins the same run
    r["joined"] = joined
    return r


def verify(
    job: JobArg,
    step: StepArg,
    tier: Annotated[
        str | None,
        typer.Option(help="The tier whose copy to read back (default: every tier holding one)."),
    ] = None,
    wait: Annotated[
        float, typer.Option(min=0, help="Wait this many seconds for the outcome (0: do not).")
    ] = 600,
    as_json: JsonOpt = False,
    api_url: ApiUrlOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR,
) -> None:
    """Read a checkpoint's copies back now (on TIER, or on every tier) and compare every checksum.

    A replica that reads back wrong is marked corrupt, the tier leaves restorable at once and a
    repair copies it back from another tier. Exits 3 when a replica read back corrupt or lost,
    1 when a verification could not be made."""
    api = Api(api_url, data_dir)
    if tier is not None:
        tiers = [tier]
    else:
        tiers = [t["tier"] for t in api.call("GET", checkpoint_path(job, step))["tiers"]]
    runs = {t: _verify_one(api, job, step, t, wait) for t in tiers}
    done = [r for r in runs.values() if r is not None]
    if tier is not None and not done:
        fail(f"{job} step {step} has no verified copy on {tier} to read (409 nothing_to_verify)")
    if as_json:
        print_json(done[0] if tier is not None else done)
    else:
        for t, r in runs.items():
            if r is None:
                console.print(f"{job} step {step} on {t}: no verified copy to read", style="dim")
            elif r["status"] == "running":
                console.print(
                    f"still reading (run {r['workflow_id']}); `tierpoint show {job} {step}`"
                )
            elif r["status"] == "completed":
                console.print(_outcome(r))
    failed = [r for r in done if r["status"] == "failed"]
    if failed:
        fail(f"verification_failed: {failed[0].get('error') or 'the run failed'}")
    if any(r["outcome"]["corrupt"] + r["outcome"]["lost"] for r in done if r.get("outcome")):
        raise typer.Exit(DAMAGE_FOUND)


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
