"""`tierpoint restore JOB DIR`: the latest restorable checkpoint, copied and verified, all or
nothing, under a restore lease."""

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table
from tierpoint_client import (
    Client,
    DestinationNotEmptyError,
    LatestCheckpoint,
    NoVerifiedCopyError,
    RestoreResult,
    TierpointError,
)
from tierpoint_client.destination import Existing, check_destination
from tierpoint_client.leases import RESTORE_LEASE_TTL, owner

from apps.cli.context import (
    ApiUrlOpt,
    DataDirOpt,
    api_errors,
    console,
    err_console,
    fail,
    make_client,
    use_stack_s3_credentials,
)
from apps.cli.render import human_bytes, plan_table
from apps.devstack.facts import DEFAULT_DATA_DIR

# The exit status of a command stopped by Ctrl-C, as a shell gives one (128 + SIGINT).
INTERRUPTED = 130
# How many of the entries kept beside the checkpoint, or removed, are named.
NAMED = 10


def restore(
    job: Annotated[str, typer.Argument(help="Job name.")],
    dest: Annotated[
        Path,
        typer.Argument(help="Directory to restore into: absent or empty, unless --force/--clean."),
    ],
    node: Annotated[
        str | None,
        typer.Option(help="This node's id: its local copies count as sources."),
    ] = None,
    tier: Annotated[
        str | None,
        typer.Option(
            help="Read from this tier only: a copy that cannot be read or fails verification "
            "there fails the restore (a bad one is reported), it does not go on from another tier."
        ),
    ] = None,
    workers: Annotated[int, typer.Option(min=1, help="Shards copied at once.")] = 4,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Restore into a DEST that holds files: the checkpoint's replace those of the "
            "same name, the others stay (and are listed).",
        ),
    ] = False,
    clean: Annotated[
        bool,
        typer.Option(
            "--clean",
            help="Restore into a DEST that holds files and remove every entry that is not the "
            "checkpoint's, once the checkpoint is verified: DEST holds exactly the checkpoint.",
        ),
    ] = False,
    show_plan: Annotated[bool, typer.Option("--plan/--no-plan", help="Print the plan.")] = False,
    api_url: ApiUrlOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR,
) -> None:
    """Restore the latest restorable checkpoint of JOB into DEST.

    Every shard is read from its fastest verified copy (a POSIX path on a local or shared tier, a
    peer's data endpoint, or an S3 object); a copy that cannot be read or fails its crc32c is
    replaced by the shard's next verified copy. The shards wait in a hidden staging directory in
    DEST until every one is verified, then move into place together: a restore that fails or is
    interrupted (Ctrl-C, exit 130) leaves DEST as it was. A restore lease keeps the checkpoint
    from expiring while it runs.
    """
    existing: Existing = "clean" if clean else "overwrite" if force else "refuse"
    try:
        check_destination(dest, existing)
    except DestinationNotEmptyError as e:
        fail(
            f"{e}: nothing was written. --force restores over it (the checkpoint's files replace "
            "those of the same name, the others stay); --clean leaves only the checkpoint in it"
        )
    except TierpointError as e:
        fail(str(e))
    client = make_client(api_url, data_dir)
    use_stack_s3_credentials(data_dir)
    try:
        with api_errors():
            # One request: the checkpoint, each shard's fastest verified copy, and the lease.
            latest = client.latest(
                job, tier=tier, node=node, lease_ttl=RESTORE_LEASE_TTL, owner=owner()
            )
            if latest is None:
                where = (f" on tier {tier}" if tier else "") + (f" for node {node}" if node else "")
                fail(f"job {job!r} has no restorable checkpoint{where}")
            if show_plan:
                console.print(plan_table(latest))
            result = _copy(client, latest, dest, workers, node, tier, existing)
    except KeyboardInterrupt:
        err_console.print(f"[bold yellow]interrupted:[/] nothing was written to {dest}")
        raise typer.Exit(INTERRUPTED) from None
    _report(result, job)


def _copy(
    client: Client,
    latest: LatestCheckpoint,
    dest: Path,
    workers: int,
    node: str | None,
    tier: str | None,
    existing: Existing,
) -> RestoreResult:
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        DownloadColumn(binary_units=True),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    done = 0
    try:
        with Progress(*columns, console=console) as progress:
            task = progress.add_task(f"{latest.job} step {latest.step}", total=latest.total_bytes)

            def advance(copied: int, _total: int) -> None:
                nonlocal done
                done = copied
                progress.update(task, completed=copied)

            return client.restore_checkpoint(
                latest,
                dest,
                workers=workers,
                progress=advance,
                node=node,
                tier=tier,
                existing=existing,
                lease_ttl=RESTORE_LEASE_TTL,
            )
    except KeyboardInterrupt as e:
        # The client's RestoreInterrupted says what DEST holds; a bare one came before it began.
        said = str(e) or f"interrupted: nothing was written to {dest}"
        err_console.print(
            f"[bold yellow]{said}[/] [dim](after {human_bytes(done)} of "
            f"{human_bytes(latest.total_bytes)})[/]",
            soft_wrap=True,
        )
        raise typer.Exit(INTERRUPTED) from None
    except (TierpointError, OSError) as e:
        # One line per copy tried, then what the destination holds now, which the client notes
        # on the error (PEP 678).
        lines = [str(e)]
        if isinstance(e, NoVerifiedCopyError) and e.tried:
            lines = [f"{e.job}/{e.step}: no copy of {e.path!r} could be read and verified:"]
            lines += e.tried
        fail("\n  ".join([*lines, *getattr(e, "__notes__", ())]))


def _report(result: RestoreResult, job: str) -> None:
    table = Table(title=f"restored into {result.dest_dir}", title_justify="left")
    for col in ("path", "size", "crc32c", "from tier"):
        table.add_column(col)
    for f in result.files:
        table.add_row(f.path, human_bytes(f.size), f.crc32c, f.tier)
    console.print(table)
    rate = result.bytes_total / result.seconds if result.seconds > 0 else 0.0
    console.print(
        f"[green]verified[/] {len(result.files)} shards, {human_bytes(result.bytes_total)} of "
        f"{job} step {result.step} in {result.seconds:.2f}s ({human_bytes(int(rate))}/s)"
    )
    if result.removed:
        console.print(f"removed {_named(result.removed)} not in the checkpoint (--clean)")
    if result.kept:
        err_console.print(
            f"[yellow]warning:[/] {result.dest_dir} also holds {_named(result.kept)} that the "
            "checkpoint does not have (kept, --force): a loader that reads the whole directory "
            "reads them too; --clean removes them"
        )


def _named(entries: tuple[str, ...]) -> str:
    shown = ", ".join(entries[:NAMED])
    more = f" and {len(entries) - NAMED} more" if len(entries) > NAMED else ""
    return f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'} ({shown}{more})"
