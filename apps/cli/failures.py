"""`tierpoint failures list` and `tierpoint failures ack`: the failed copies, each saying whether
a retry can help, and an operator's acknowledgement of the ones that need none: one checkpoint's,
every one of a job, or every one whose reason contains a text. Acknowledgements are recorded by
the API with the token's name."""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import urlencode

import typer

from apps.cli.actions import JsonOpt
from apps.cli.context import ApiUrlOpt, DataDirOpt, console, fail
from apps.cli.ops_render import failures_table, print_json
from apps.cli.policy import Api
from apps.cli.show import checkpoint_path
from apps.devstack.facts import DEFAULT_DATA_DIR

failures = typer.Typer(
    help="Failed copies: list them (with whether a retry can help) and acknowledge the ones "
    "that need no retry."
)

ReasonOpt = Annotated[
    str | None,
    typer.Option(help="Only failures whose reason contains this text, in any case."),
]


def _query(job: str | None, reason: str | None, limit: int) -> str:
    given = {"job": job, "reason": reason, "limit": limit}
    return urlencode({k: v for k, v in given.items() if v is not None})


@failures.command("list")
def list_failures(
    job: Annotated[str | None, typer.Option(help="Only this job's failures.")] = None,
    reason: ReasonOpt = None,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="Show at most this many.")] = 100,
    as_json: JsonOpt = False,
    api_url: ApiUrlOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR,
) -> None:
    """Open failures, newest first: the reason, and the retry command where a retry can help
    (else why none can). The title says how many match in all when the list is cut."""
    page = Api(api_url, data_dir).call("GET", f"/v1/failures?{_query(job, reason, limit)}")
    if as_json:
        print_json(page)
    elif page["items"]:
        console.print(failures_table(page))
    else:
        console.print("no failures", style="green")


@failures.command("ack")
def ack(
    job: Annotated[
        str | None, typer.Argument(help="Job name (omitted: every job, with --reason).")
    ] = None,
    step: Annotated[
        int | None,
        typer.Argument(min=0, help="Checkpoint step (omitted: every failure of the job)."),
    ] = None,
    reason: ReasonOpt = None,
    tier: Annotated[str | None, typer.Option(help="Only failures on this tier.")] = None,
    as_json: JsonOpt = False,
    api_url: ApiUrlOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR,
) -> None:
    """Acknowledge failed copies: they leave the failures list and stay in their checkpoints'
    history. JOB STEP: that checkpoint's; JOB: every failure of the job; --reason TEXT: every
    failure whose reason contains TEXT (with JOB: of that job). Nothing is copied or deleted; a
    retry or a new failure lists it again."""
    api = Api(api_url, data_dir)
    if step is not None:
        assert job is not None  # a step follows a job on the command line
        if reason is not None:
            fail("--reason selects failures across checkpoints: give JOB without STEP")
        on = {"tier": tier} if tier is not None else None
        r = api.call("POST", f"{checkpoint_path(job, step)}/acknowledge", on)
        if as_json:
            print_json(r)
            return
        for t, why in r["acknowledged"].items():
            console.print(f"acknowledged {job} step {step} on {t}: {why or 'no reason recorded'}")
        return
    if job is None and reason is None:
        fail("say which failures: JOB [STEP], or --reason TEXT (see `tierpoint failures list`)")
    wanted = {"job": job, "reason": reason, "tier": tier}
    body: dict[str, Any] = {k: v for k, v in wanted.items() if v is not None}
    out = api.call("POST", "/v1/failures/acknowledge", body)
    if as_json:
        print_json(out)
        return
    for a in out["items"]:
        why = a["reason"] or "no reason recorded"
        console.print(f"acknowledged {a['job']} step {a['step']} on {a['tier']}: {why}")
    if out["acknowledged"] > len(out["items"]):
        console.print(f"... and {out['acknowledged'] - len(out['items'])} more", style="dim")
    console.print(f"{out['acknowledged']} failure(s) acknowledged", style="bold")
