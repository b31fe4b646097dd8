"""A run's timeline from the command line (docs/timeline.md): `tierpoint rollback JOB STEP`,
`tierpoint branches JOB`, `tierpoint verdict JOB STEP good|suspect|bad`, `tierpoint fork NEW_JOB
--from JOB:STEP`, `tierpoint lineage JOB STEP`. REST clients of the timeline routes."""

from __future__ import annotations

import re
from typing import Annotated, Any
from urllib.parse import quote

import typer
from rich.table import Table
from tierpoint_client.transport import RetryPolicy, Transport

from apps.cli.context import ApiUrlOpt, DataDirOpt, api_errors, console, fail, resolve_api
from apps.devstack.facts import DEFAULT_DATA_DIR

JobArg = Annotated[str, typer.Argument(help="Job name.")]
StepArg = Annotated[int, typer.Argument(min=0, help="Checkpoint step.")]
BranchOpt = Annotated[
    int | None,
    typer.Option(min=1, help="The checkpoint saved on this branch (default: the timeline's)."),
]
# JOB:STEP or JOB:STEP@BRANCH
_REF = re.compile(r"^(?P<job>[^:]+):(?P<step>[0-9]+)(@(?P<branch>[1-9][0-9]*))?$")


def _api(api_url: str | None, data_dir: Any) -> Transport:
    url, token = resolve_api(api_url, data_dir)
    return Transport(url, token, 30.0, RetryPolicy())


def _job(job: str) -> str:
    return quote(job, safe="")


def rollback(
    job: JobArg,
    step: StepArg,
    from_branch: Annotated[
        int | None,
        typer.Option(min=1, help="The branch you roll back from: refused if another won."),
    ] = None,
    reason: Annotated[str | None, typer.Option(help="Why (recorded on the branch).")] = None,
    api_url: ApiUrlOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR,
) -> None:
    """Go back to STEP: a new branch starts from it; the steps after it are superseded."""
    body: dict[str, Any] = {"step": step, "from_branch": from_branch, "reason": reason}
    with api_errors():
        r = _api(api_url, data_dir).request("POST", f"/v1/jobs/{_job(job)}/rollback", body=body)
    out = r.body
    b = out["branch"]
    if not out["created"]:
        console.print(f"{job} is on branch {b['number']} from step {step} already: nothing to do")
        return
    left = out["superseded"]
    console.print(
        f"[bold]rolled back[/] {job} to step {step}: branch {b['number']} (from branch "
        f"{b['parent']}); {len(left)} superseded"
        + (f": {', '.join(map(str, left))}" if left else "")
    )
    where = b["step_dir"].replace("{step}", "<step>")
    console.print(f"save the next steps on branch {b['number']}, under <root>/{job}/{where}/")


def branches(
    job: JobArg, api_url: ApiUrlOpt = None, data_dir: DataDirOpt = DEFAULT_DATA_DIR
) -> None:
    """A job's branches: where each starts, who rolled back, which is current."""
    with api_errors():
        r = _api(api_url, data_dir).request("GET", f"/v1/jobs/{_job(job)}/branches")
    table = Table(title=f"{job}: branches", title_justify="left")
    for col in ("branch", "from", "at step", "by", "created", "reason"):
        table.add_column(col)
    for b in r.body["items"]:
        table.add_row(
            f"{b['number']}{' (current)' if b['current'] else ''}",
            "" if b["parent"] is None else str(b["parent"]),
            "" if b["from_step"] is None else str(b["from_step"]),
            b["created_by"] or "",
            b["created_at"],
            b["reason"] or "",
        )
    console.print(table)


def verdict(
    job: JobArg,
    step: StepArg,
    health: Annotated[str, typer.Argument(help="good, suspect or bad (bad quarantines it).")],
    metric: Annotated[str | None, typer.Option(help="What was measured, e.g. loss.")] = None,
    value: Annotated[
        str | None, typer.Option(help="What it measured (a number, NaN, inf).")
    ] = None,
    at_step: Annotated[int | None, typer.Option(min=0, help="The step that measured it.")] = None,
    detail: Annotated[str | None, typer.Option(help="More evidence, in words.")] = None,
    branch: BranchOpt = None,
    api_url: ApiUrlOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR,
) -> None:
    """Mark a checkpoint good, suspect or bad, with evidence."""
    number: float | None = None
    if value is not None:
        try:
            number = float(value)
        except ValueError:
            fail(f"--value must be a number, NaN or inf, not {value!r}")
    body = {
        "verdict": health,
        "metric": metric,
        "value": None if number is None else ("NaN" if number != number else number),
        "at_step": at_step,
        "detail": detail,
    }
    if number is not None and number in (float("inf"), float("-inf")):
        body["value"] = "Infinity" if number > 0 else "-Infinity"
    with api_errors():
        r = _api(api_url, data_dir).request(
            "PUT",
            f"/v1/jobs/{_job(job)}/checkpoints/{step}/verdict",
            query={"branch": branch},
            body=body,
        )
    cp = r.body
    console.print(f"{job} step {step} (branch {cp['branch']}): [bold]{cp['health']['verdict']}[/]")
    if cp["quarantine_reason"]:
        console.print(f"quarantined: {cp['quarantine_reason']}")


def fork(
    job: Annotated[str, typer.Argument(help="The new job.")],
    parent: Annotated[
        str, typer.Option("--from", help="The checkpoint it starts from: JOB:STEP[@BRANCH].")
    ],
    api_url: ApiUrlOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR,
) -> None:
    """Start a new job from another job's checkpoint (a fine-tune from a pre-training step)."""
    m = _REF.match(parent)
    if m is None:
        fail(f"--from takes JOB:STEP or JOB:STEP@BRANCH, not {parent!r}")
    ref = {"job": m["job"], "step": int(m["step"])}
    if m["branch"]:
        ref["branch"] = int(m["branch"])
    with api_errors():
        r = _api(api_url, data_dir).request(
            "POST", f"/v1/jobs/{_job(job)}/fork", body={"parent": ref}
        )
    p = r.body["parent"]
    said = "forked" if r.body["created"] else "already forked"
    console.print(f"[bold]{said}[/] {job} from {p['job']} step {p['step']} (branch {p['branch']})")


def lineage(
    job: JobArg,
    step: StepArg,
    branch: BranchOpt = None,
    limit: Annotated[int, typer.Option(min=1, max=10_000, help="At most this many.")] = 100,
    api_url: ApiUrlOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR,
) -> None:
    """A checkpoint's ancestry up to its root, and its descendants."""
    with api_errors():
        r = _api(api_url, data_dir).request(
            "GET",
            f"/v1/jobs/{_job(job)}/checkpoints/{step}/lineage",
            query={"branch": branch, "limit": limit},
        )
    out = r.body
    table = Table(title=f"{job} step {step}: lineage", title_justify="left")
    for col in ("", "job", "step", "branch", "health", "superseded", "created"):
        table.add_column(col)
    rows = [("descendant", d) for d in reversed(out["descendants"])]
    rows += [("this", out["checkpoint"])] + [("ancestor", a) for a in out["ancestors"]]
    for what, n in rows:
        table.add_row(
            what,
            n["job"],
            str(n["step"]),
            str(n["branch"]),
            n["health"] or "",
            "superseded" if n["superseded"] else "",
            n["created_at"],
        )
    console.print(table)
    if out["truncated"]:
        console.print(f"more than {limit} descendants: --limit shows more", style="dim")
