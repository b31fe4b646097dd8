"""`tierpoint restore JOB DIR`: the latest restorable checkpoint, copied and verified."""

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
from tierpoint_client import NoVerifiedCopyError

from apps.cli.context import (
    ApiUrlOpt,
    DataDirOpt,
    api_errors,
    console,
    fail,
    make_client,
    use_stack_s3_credentials,
)
from apps.cli.render import human_bytes, plan_table
from apps.devstack.facts import DEFAULT_DATA_DIR


def restore(
    job: Annotated[str, typer.Argument(help="Job name.")],
    dest: Annotated[Path, typer.Argument(help="Directory to restore the shards into.")],
    node: Annotated[
        str | None,
        typer.Option(help="This node's id: its local copies count as sources."),
    ] = None,
    tier: Annotated[
        str | None,
        typer.Option(
            help="Read from this tier only: a copy that fails verification there is reported and "
            "the restore fails, it does not go on from another tier."
        ),
    ] = None,
    workers: Annotated[int, typer.Option(min=1, help="Shards copied at once.")] = 4,
    show_plan: Annotated[bool, typer.Option("--plan/--no-plan", help="Print the plan.")] = False,
    api_url: ApiUrlOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR,
) -> None:
    """Restore the latest restorable checkpoint of JOB into DEST.

    Each shard is read from the plan's source (a POSIX path on a local or shared tier, or an S3
    object), its crc32c checked while copying, and renamed into place only when it matches.
    """
    client = make_client(api_url, data_dir)
    use_stack_s3_credentials(data_dir)
    with api_errors():
        latest = client.latest(job, tier=tier, node=node)
        if latest is None:
            where = (f" on tier {tier}" if tier else "") + (f" for node {node}" if node else "")
            fail(f"job {job!r} has no restorable checkpoint{where}")
        if show_plan:
            console.print(plan_table(latest))
        columns = (
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            DownloadColumn(binary_units=True),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
        )
        with Progress(*columns, console=console) as progress:
            task = progress.add_task(f"{job} step {latest.step}", total=latest.total_bytes)
            try:
                result = client.restore_checkpoint(
                    latest,
                    dest,
                    workers=workers,
                    progress=lambda done, _total: progress.update(task, completed=done),
                    node=node,
                    tier=tier,
                )
            except NoVerifiedCopyError as e:
                # One line per copy tried, and why it was given up.
                said = f"{e.job}/{e.step}: no copy of {e.path!r} could be read and verified:"
                fail("\n  ".join([said, *e.tried]))
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
