"""`tierpoint token create|bootstrap|list|revoke`: API access tokens, straight in the catalog.

These commands talk to the catalog, not to the API: the first admin token of a fresh install
cannot come from an API that refuses every request without one, and whoever holds the catalog's
credentials is an admin anyway. `create` prints the secret once, alone on stdout (so that
`TOKEN=$(tierpoint token create ...)` works); it is never stored or shown again."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from apps.cli.context import console, err_console, fail
from apps.cli.serve import settings_or_fail

if TYPE_CHECKING:
    # Only for the annotation: importing SQLAlchemy costs every `tierpoint` command ~1 s.
    from tierpoint.catalog.engine import Session

app = typer.Typer(
    help="API access tokens (in the catalog: needs TIERPOINT_DATABASE_URL).",
    no_args_is_help=True,
)

DEFAULT_EXPIRY = "90d"
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"^(\d{1,6})([smhdw])$")

DatabaseUrlOpt = Annotated[
    str | None,
    typer.Option(help="Catalog URL.", show_default="setting database_url"),
]


def parse_expiry(text: str) -> timedelta | None:
    """`90d`, `12h`, `30m`, `2w`, `3600s`; `never` for a token that does not expire."""
    if text == "never":
        return None
    m = _DURATION.match(text.strip())
    if m is None or int(m.group(1)) == 0:
        raise typer.BadParameter(f"{text!r}: use e.g. 90d, 12h, 30m, 2w, or never")
    return timedelta(seconds=int(m.group(1)) * _UNITS[m.group(2)])


def _when(value: datetime | None) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M") if value is not None else "-"


@app.command("create")
def create(
    name: Annotated[str, typer.Argument(help="Token name, recorded as the actor of changes.")],
    scope: Annotated[
        list[str],
        typer.Option(
            "--scope",
            help="read | operate | admin | train:<job prefix>. Repeat for several.",
            show_default=False,
        ),
    ],
    expires_in: Annotated[
        str, typer.Option("--expires-in", help="e.g. 90d, 12h, 2w, or never.")
    ] = DEFAULT_EXPIRY,
    database_url: DatabaseUrlOpt = None,
) -> None:
    """Create a token and print its secret, once."""
    from tierpoint.catalog.token import tokens
    from tierpoint.errors import TierpointError

    expiry = parse_expiry(expires_in)
    with _session(database_url) as session:
        try:
            new = tokens.create_token(session, name, scope, expiry)
        except TierpointError as exc:
            fail(f"{exc.detail} ({exc.code})")
        session.commit()
    expires = _when(new.view.expires_at) if new.view.expires_at else "never"
    err_console.print(
        f"token [bold]{name}[/] created: scopes {', '.join(new.view.scopes)}, expires {expires}."
        "\nIts secret follows; it is shown only this once:"
    )
    # Plain print: no wrapping or markup may alter the secret.
    print(new.secret)


@app.command("bootstrap")
def bootstrap(
    name: Annotated[str, typer.Option(help="Name of the admin token made.")] = "admin",
    expires_in: Annotated[
        str, typer.Option("--expires-in", help="e.g. 90d, 12h, 2w, or never.")
    ] = DEFAULT_EXPIRY,
    database_url: DatabaseUrlOpt = None,
) -> None:
    """The install's first admin token: its secret alone on stdout (for a Secret), or nothing
    when an active admin token exists already (run it again safely)."""
    from tierpoint.catalog.token import tokens
    from tierpoint.errors import TierpointError

    expiry = parse_expiry(expires_in)
    with _session(database_url) as session:
        try:
            made = tokens.first_admin_token(session, name, expiry)
        except TierpointError as exc:
            fail(f"{exc.detail} ({exc.code})")
        session.commit()
    if isinstance(made, tokens.TokenView):
        # Not an error: the install is bootstrapped. stdout stays empty, so no Secret is
        # overwritten with a token that was never made.
        err_console.print(
            f"an active admin token exists already ([bold]{made.name}[/]): none made. "
            'To rotate: docs/deployment.md, "The first admin token".'
        )
        return
    expires = _when(made.view.expires_at) if made.view.expires_at else "never"
    err_console.print(f"admin token [bold]{name}[/] created, expires {expires}.")
    print(made.secret)


@app.command("list")
def list_(database_url: DatabaseUrlOpt = None) -> None:
    """Every token with its scopes and state (never a secret: none is stored)."""
    from tierpoint.catalog.token import tokens

    with _session(database_url) as session:
        views = tokens.list_tokens(session)
    now = datetime.now(UTC)
    if not views:
        console.print("no tokens: create one with `tierpoint token create NAME --scope admin`")
        return
    table = Table(title="access tokens")
    for col in ("name", "scopes", "state", "created", "expires", "last used"):
        table.add_column(col)
    for v in views:
        table.add_row(
            v.name,
            " ".join(v.scopes),
            v.status(now),
            _when(v.created_at),
            _when(v.expires_at) if v.expires_at else "never",
            _when(v.last_used_at),
        )
    console.print(table)


@app.command("revoke")
def revoke(
    name: Annotated[str, typer.Argument(help="Token name.")], database_url: DatabaseUrlOpt = None
) -> None:
    """Revoke a token: refused by every API process within `token_cache_seconds`."""
    from tierpoint.catalog.token import tokens
    from tierpoint.errors import TierpointError

    with _session(database_url) as session:
        try:
            _, revoked = tokens.revoke_token(session, name)
        except TierpointError as exc:
            fail(f"{exc.detail} ({exc.code})")
        session.commit()
    console.print(f"token [bold]{name}[/] " + ("revoked" if revoked else "was already revoked"))


@contextlib.contextmanager
def _session(database_url: str | None) -> Iterator[Session]:
    """A catalog session for one command; one clear line when the catalog cannot be used."""
    from tierpoint.catalog.engine import (
        CATALOG_UNREACHABLE,
        NotMigrated,
        make_sync_engine,
        sync_sessions,
    )

    engine = make_sync_engine(database_url or settings_or_fail().database_url, pool_size=1)
    try:
        with sync_sessions(engine)() as session:
            yield session
    except CATALOG_UNREACHABLE as exc:
        fail(f"cannot reach the catalog: {str(exc).splitlines()[0]}")
    except NotMigrated as exc:
        fail(f"the catalog is not migrated? ({str(exc).splitlines()[0]}); run `tierpoint migrate`")
    finally:
        engine.dispose()
