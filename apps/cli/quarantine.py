"""`tierpoint quarantine JOB STEP --reason ...` and `tierpoint unquarantine JOB STEP`: take a
checkpoint (or one tier's copy, `--tier`) out of latest restorable after a bad load, and put it
back. A quarantined checkpoint is evidence: retention never expires it."""

from typing import Annotated

import typer
from tierpoint_client import Client
from tierpoint_client.errors import ApiError

from apps.cli.context import ApiUrlOpt, DataDirOpt, api_errors, console, make_client
from apps.cli.render import tiers_table
from apps.devstack.facts import DEFAULT_DATA_DIR

JobArg = Annotated[str, typer.Argument(help="Job name.")]
StepArg = Annotated[int, typer.Argument(min=0, help="Checkpoint step.")]
TierOpt = Annotated[
    str | None, typer.Option(help="Only this tier's copy (default: the whole checkpoint).")
]


def _what(job: str, step: int, tier: str | None) -> str:
    return f"{job} step {step}" + (f" on {tier}" if tier else "")


def quarantine(
    job: JobArg,
    step: StepArg,
    reason: Annotated[
        str, typer.Option(help="Why it must not be restored from (e.g. 'loss NaN after load').")
    ],
    tier: TierOpt = None,
    api_url: ApiUrlOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR,
) -> None:
    """Quarantine a checkpoint: restores take the next best one, retention keeps it."""
    client = make_client(api_url, data_dir)
    with api_errors():
        cp = client.quarantine(job, step, reason, tier=tier)
    console.print(f"[bold red]quarantined[/] {_what(job, step, tier)}: {reason}")
    console.print(tiers_table(cp))


def unquarantine(
    job: JobArg,
    step: StepArg,
    tier: TierOpt = None,
    api_url: ApiUrlOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR,
) -> None:
    """Lift a quarantine: the checkpoint (or the tier's copy) can be restored again."""
    client = make_client(api_url, data_dir)
    was = _quarantined(client, job, step, tier)
    with api_errors():
        cp = client.lift_quarantine(job, step, tier=tier)
    if was is None:
        console.print(f"{_what(job, step, tier)} was not quarantined: nothing to lift")
    else:
        lifted = f" ({was})" if was else ""
        console.print(f"[bold green]lifted[/] the quarantine of {_what(job, step, tier)}{lifted}")
    console.print(tiers_table(cp))


def _quarantined(client: Client, job: str, step: int, tier: str | None) -> str | None:
    """The quarantine's reason before lifting it; None if there was none; "" when the token may
    not read the checkpoint (an operate-only token): then it cannot be told."""
    try:
        before = client.checkpoint(job, step)
    except ApiError:
        return ""  # the lift itself reports anything else that is wrong
    if tier is None:
        return before.quarantine_reason
    return next((t.quarantine_reason for t in before.tiers if t.tier == tier), None)
