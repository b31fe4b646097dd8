"""Production processes: `tierpoint api`, `tierpoint worker`, `tierpoint migrate`.

Settings come from TIERPOINT_* environment variables and the TOML file named by
TIERPOINT_CONFIG_FILE (default ./tierpoint.toml); see tierpoint.config.Settings.
"""

import asyncio
import signal
import ssl
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from apps.cli.context import console, err_console, fail
from tierpoint.long_lived import freeze_long_lived

if TYPE_CHECKING:
    from tierpoint.config import Settings


def settings_or_fail() -> "Settings":
    from pydantic import ValidationError

    from tierpoint.config import Settings

    try:
        return Settings()
    except ValidationError as exc:
        fail(f"invalid settings (TIERPOINT_* environment / TOML file):\n{exc}")


def api(
    host: Annotated[
        str | None, typer.Option(help="Bind address.", show_default="setting api_host: 127.0.0.1")
    ] = None,
    port: Annotated[
        int | None, typer.Option(help="Port.", show_default="setting api_port: 8080")
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            help="Serve Prometheus /metrics on this port (a listener apart from the API).",
            show_default="setting api_metrics_port: none",
        ),
    ] = None,
    metrics_host: Annotated[
        str | None,
        typer.Option(
            help="Bind address of /metrics.", show_default="setting api_metrics_host: 127.0.0.1"
        ),
    ] = None,
    tls_cert: Annotated[
        Path | None,
        typer.Option(
            help="Serve HTTPS with this certificate (PEM), with --tls-key; else plain HTTP.",
            show_default="setting api_tls_cert: none",
        ),
    ] = None,
    tls_key: Annotated[
        Path | None,
        typer.Option(
            help="The certificate's private key (PEM).", show_default="setting api_tls_key: none"
        ),
    ] = None,
    tls_client_ca: Annotated[
        Path | None,
        typer.Option(
            help="Mutual TLS: admit only clients with a certificate this CA signed.",
            show_default="setting api_tls_client_ca: none",
        ),
    ] = None,
    insecure_no_auth: Annotated[
        bool,
        typer.Option(
            "--insecure-no-auth",
            help="Serve WITHOUT authentication: every caller may do everything "
            "(also TIERPOINT_INSECURE_NO_AUTH=true). Only on a closed test network.",
        ),
    ] = False,
) -> None:
    """Serve the REST API (uvicorn). Run N of these behind a load balancer.

    Every route but /healthz and /readyz needs a bearer token (`tierpoint token create`).
    Prometheus metrics are served on a port of their own (--metrics-port), never on the API's."""
    import uvicorn

    from api.app import create_app
    from tierpoint import logs

    settings = with_tls(settings_or_fail(), tls_cert, tls_key, tls_client_ca)
    if insecure_no_auth:
        settings = settings.model_copy(update={"insecure_no_auth": True})
    if metrics_port is not None:
        settings = settings.model_copy(update={"api_metrics_port": metrics_port})
    if metrics_host is not None:
        settings = settings.model_copy(update={"api_metrics_host": metrics_host})
    logs.configure(settings.log_level, settings.log_json)
    if settings.insecure_no_auth:
        err_console.print(
            "[bold red]WARNING: authentication is OFF (--insecure-no-auth): anyone who reaches "
            "this API may register, delete and change policies.[/]"
        )
    app = create_app(settings)
    freeze_long_lived()
    uvicorn.run(
        app,
        host=host or settings.api_host,
        port=settings.api_port if port is None else port,
        log_level=settings.log_level.lower(),
        # uvicorn's own lines go through our logs (JSON with log_json); each request is logged
        # once, by the API's middleware, so uvicorn's access line would say it twice.
        log_config=None,
        access_log=False,
        **tls_options(settings),
    )


def with_tls(
    settings: "Settings", cert: Path | None, key: Path | None, client_ca: Path | None
) -> "Settings":
    """The settings with the TLS options given on the command line, checked as settings are."""
    from pydantic import ValidationError

    given = {"api_tls_cert": cert, "api_tls_key": key, "api_tls_client_ca": client_ca}
    changes = {k: v for k, v in given.items() if v is not None}
    if not changes:
        return settings
    try:
        return type(settings).model_validate(settings.model_dump() | changes)
    except ValidationError as exc:
        fail(f"invalid TLS options: {exc.errors()[0]['msg']}")


def tls_options(settings: "Settings") -> dict[str, Any]:
    """uvicorn's arguments for the API's TLS: none (plain HTTP), a certificate, or a certificate
    and a client CA that every connection must present a certificate of (mutual TLS)."""
    if settings.api_tls_cert is None:
        return {}
    options: dict[str, Any] = {
        "ssl_certfile": str(settings.api_tls_cert),
        "ssl_keyfile": str(settings.api_tls_key),
    }
    if settings.api_tls_client_ca is not None:
        options["ssl_ca_certs"] = str(settings.api_tls_client_ca)
        # guard: api-mutual-tls-requires-a-certificate
        options["ssl_cert_reqs"] = ssl.CERT_REQUIRED
    return options


def worker(
    node: Annotated[
        list[str] | None,
        typer.Option(
            "--node",
            help="Serve this node's task queue (its local tier). Repeat for several.",
            show_default="with --no-shared: setting node (TIERPOINT_NODE)",
        ),
    ] = None,
    shared: Annotated[
        bool,
        typer.Option(
            "--shared/--no-shared",
            help="Also run the shared worker: workflows, shared and S3 tiers, the reconciler.",
        ),
    ] = True,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            help="Serve Prometheus /metrics on this port.",
            show_default="setting worker_metrics_port: none",
        ),
    ] = None,
    metrics_host: Annotated[
        str | None,
        typer.Option(
            help="Bind address of /metrics.", show_default="setting worker_metrics_host: 127.0.0.1"
        ),
    ] = None,
) -> None:
    """Run Temporal workers: `--node N --no-shared` on each training node.

    Plain `tierpoint worker` runs the shared worker (workflows, shared and S3 tiers, reconciler)
    and can run anywhere.
    """
    settings = settings_or_fail()
    # TIERPOINT_NODE names a node worker's node (`--no-shared`), not a shared worker's: one that
    # runs on a training host, where the client has the variable too, stays a shared worker only.
    default = [settings.node] if settings.node and not shared else []
    nodes = list(node or default)
    if not nodes and not shared:
        fail("nothing to run: give --node N (or TIERPOINT_NODE), or leave --shared on")
    if nodes:
        from apps.worker import check_data_tls

        try:
            check_data_tls(settings)
        except ValueError as exc:
            fail(f"cannot serve nodes {', '.join(nodes)}: {exc}")

    async def main() -> None:
        from apps.worker import run_workers
        from tierpoint import logs
        from tierpoint.temporal import connect

        logs.configure(settings.log_level, settings.log_json)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        client = await connect(settings)
        what = ", ".join([*(f"node {n}" for n in nodes), *(["shared"] if shared else [])])
        console.print(f"tierpoint worker: {what} (Temporal {settings.temporal_address})")
        await run_workers(
            settings,
            client,
            nodes=nodes,
            shared=shared,
            stop=stop,
            metrics_port=settings.worker_metrics_port if metrics_port is None else metrics_port,
            metrics_host=metrics_host or settings.worker_metrics_host,
        )

    asyncio.run(main())


def migrate(
    check: Annotated[
        bool,
        typer.Option("--check", help="Only check that the catalog is at this version's head."),
    ] = False,
    database_url: Annotated[
        str | None,
        typer.Option(help="Catalog URL.", show_default="setting database_url"),
    ] = None,
) -> None:
    """Apply the catalog migrations (Alembic) up to head, or check that they are applied."""
    from tierpoint.catalog import migrate as m
    from tierpoint.catalog.engine import make_sync_engine

    url = database_url or settings_or_fail().database_url
    if check:
        engine = make_sync_engine(url, pool_size=1)
        try:
            m.check_schema(engine)
        except m.SchemaMismatch as exc:
            fail(str(exc))
        except Exception as exc:
            fail(f"cannot read the catalog: {exc}")
        finally:
            engine.dispose()
        console.print(f"catalog schema is at head ({m.head_revision()})")
        return
    try:
        m.upgrade(url)
    except Exception as exc:
        fail(f"migration failed: {exc}")
    console.print(f"catalog schema upgraded to head ({m.head_revision()})")
