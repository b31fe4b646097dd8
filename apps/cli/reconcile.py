"""`tierpoint reconcile`: compare the catalog with what each tier really holds (POST /v1/reconcile,
then the run's report), optionally repairing what it finds."""

import json
import time
from typing import Annotated, Any

import typer
from rich.table import Table

from apps.cli.context import DAMAGE_FOUND, ApiUrlOpt, DataDirOpt, console, fail
from apps.cli.policy import Api
from apps.devstack.facts import DEFAULT_DATA_DIR

POLL = 0.5
# Findings that mean registered data is not where the catalog says: the exit status says so.
DAMAGE = ("missing", "wrong_size")


def damage_found(report: dict[str, Any]) -> int:
    return sum(t.get("counts", {}).get(k, 0) for t in report["tiers"] for k in DAMAGE)


def unchecked_tiers(report: dict[str, Any]) -> list[str]:
    """Tiers whose scan ended in an error: not checked, so their silence is no all-clear."""
    return sorted({t["tier"] for t in report["tiers"] if t.get("error")})


def _table(report: dict[str, Any]) -> Table:
    table = Table(title="reconciliation", title_justify="left")
    for col in ("tier", "node", "listed", "checked", "findings", "marked", "cleaned"):
        table.add_column(col)
    for t in report["tiers"]:
        counts = t.get("counts") or {}
        findings = ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"
        if t.get("error"):
            findings = f"[red]error: {t['error']}[/]"
        table.add_row(
            t["tier"],
            t.get("node") or "",
            str(t["scanned"]),
            str(t["checked"]),
            findings,
            str(t["marked"]),
            str(t["cleaned"]),
        )
    return table


def reconcile(
    tier: Annotated[str | None, typer.Option(help="Only this tier.")] = None,
    job: Annotated[str | None, typer.Option(help="Only this job.")] = None,
    repair: Annotated[
        bool,
        typer.Option(
            help="Mark missing or wrong-sized replicas lost/corrupt, re-copy them from other "
            "tiers, and remove abandoned temp files and multipart uploads. Files nobody "
            "registered are reported, never deleted."
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    timeout: Annotated[float, typer.Option(help="Give up waiting after this many seconds.")] = 3600,
    api_url: ApiUrlOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR,
) -> None:
    """Compare the catalog with the tiers: missing or wrong-sized copies, unknown files, abandoned
    temp files and uploads. Exits 3 when registered copies are missing or have the wrong size,
    1 when the run, or any tier's part of it, could not be made."""
    api = Api(api_url, data_dir)
    run = api.call("POST", "/v1/reconcile", {"tier": tier, "job": job, "repair": repair})["id"]
    deadline = time.monotonic() + timeout
    with console.status(f"reconciling (run {run})", spinner="dots"):
        while (body := api.call("GET", f"/v1/reconcile/{run}"))["status"] == "running":
            if time.monotonic() > deadline:
                fail(f"run {run} still running after {timeout:g}s")
            time.sleep(POLL)
    if body["status"] != "completed" or body.get("report") is None:
        fail(f"run {run} ended {body['status']}")
    report = body["report"]
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        _print(report)
    if damage_found(report):
        raise typer.Exit(DAMAGE_FOUND)
    errored = unchecked_tiers(report)
    if errored:
        fail(f"could not reconcile {', '.join(errored)}: see the errors above")


def _print(report: dict[str, Any]) -> None:
    console.print(_table(report))
    for t in report["tiers"]:
        for kind, examples in sorted((t.get("examples") or {}).items()):
            for e in examples:
                console.print(
                    f"  {t['tier']}{'@' + t['node'] if t.get('node') else ''} {kind}: {e}"
                )
    if report.get("repairs_requested"):
        console.print(f"repair started for {report['repairs_requested']} checkpoint(s)")
