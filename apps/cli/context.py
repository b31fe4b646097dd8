"""What every client command needs: where the API is, the token, and clear failures."""

import contextlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Annotated, NoReturn

import httpx
import typer
from rich.console import Console
from rich.markup import escape
from tierpoint_client import ApiError, Client, TierpointError, TransportError

from apps.devstack.facts import StackInfo, StackNotRunning, read_stack_info

# Off a terminal (a pipe, a log file) rich would wrap every table at 80 columns and cut long
# values; there a line is as long as its content. COLUMNS still decides when set.
UNWRAPPED_WIDTH = 1000


def _console(stderr: bool = False) -> Console:
    made = Console(stderr=stderr)
    if not made.is_terminal and not os.environ.get("COLUMNS"):
        made = Console(stderr=stderr, width=UNWRAPPED_WIDTH)
    return made


console = _console()
err_console = _console(stderr=True)

DataDirOpt = Annotated[
    Path,
    typer.Option(
        "--data-dir",
        envvar="TIERPOINT_DATA_DIR",
        help="Data dir of a `tierpoint dev` stack (its stack.json says where the API is).",
    ),
]
ApiUrlOpt = Annotated[
    str | None,
    typer.Option(
        "--api-url",
        envvar="TIERPOINT_API_URL",
        help="tierpoint API base URL.",
        show_default="from DATA_DIR/stack.json",
    ),
]


# `tierpoint --token ...` (main.py) sets this; it wins over TIERPOINT_TOKEN and stack.json.
_token_flag: str | None = None


def set_token(token: str | None) -> None:
    global _token_flag
    _token_flag = token or None


def token_for(info: StackInfo | None) -> str | None:
    """The API token: --token, else TIERPOINT_TOKEN, else the dev stack's (stack.json)."""
    token = _token_flag or os.environ.get("TIERPOINT_TOKEN") or None
    if token is None and info is not None:
        return info.token
    return token


# The exit status of `verify` and `reconcile` when they found data bad (corrupt, lost, missing,
# wrong size): 1 stays "the command failed", so a script can tell the two apart.
DAMAGE_FOUND = 3


def fail(message: str, code: int = 1) -> NoReturn:
    err_console.print(f"[bold red]error:[/] {message}")
    raise typer.Exit(code)


def stack_info(data_dir: Path) -> StackInfo | None:
    with contextlib.suppress(StackNotRunning):
        return read_stack_info(data_dir)
    return None


def resolve_api(api_url: str | None, data_dir: Path) -> tuple[str, str | None]:
    """API URL and token: --api-url / TIERPOINT_API_URL, else the dev stack's stack.json; the
    token as `token_for` finds it (a dev stack's token only goes to that stack's API)."""
    if api_url:
        return api_url.rstrip("/"), token_for(None)
    try:
        info = read_stack_info(data_dir)
    except StackNotRunning as exc:
        fail(f"{exc}; or pass --api-url / set TIERPOINT_API_URL")
    return info.api_url, token_for(info)


def make_client(api_url: str | None, data_dir: Path) -> Client:
    url, token = resolve_api(api_url, data_dir)
    return Client(url, token=token)


def use_stack_s3_credentials(data_dir: Path) -> None:
    """Restores from the dev stack's S3 need its keys, under the names its tiers read them from
    (`credentials_env`); other S3 tiers keep the AWS chain, untouched."""
    info = stack_info(data_dir)
    if info is None:
        return
    for name, value in info.s3.credential_vars().items():
        os.environ.setdefault(name, value)


# What to do when the API refused the token (401: missing, invalid, expired or revoked).
TOKEN_HINT = "pass --token, set TIERPOINT_TOKEN, or use a dev stack's --data-dir"


def fail_problem(
    status: int, code: str | None, detail: str, field_errors: Sequence[str] = ()
) -> NoReturn:
    """The one rendering of an API's refusal: its detail and stable code on one line (with what
    to do when the token was refused), the fields it names below; exit 1. Every client command
    fails this way, whichever HTTP client it used."""
    line = f"{escape(detail)} [dim]({status} {escape(code or 'error')})[/]"
    if status == 401:
        line += f"; {TOKEN_HINT}"
    fail("\n".join([line, *(f"  {escape(e)}" for e in field_errors)]))


def fail_response(r: httpx.Response) -> NoReturn:
    """A problem answer (or any error answer) of the API as the command's failure."""
    try:
        p = r.json()
    except ValueError:
        p = None
    if not isinstance(p, dict):
        fail_problem(r.status_code, None, r.text[:200])
    errors = [
        f"{e.get('field') or e.get('loc')}: {e.get('msg') or e.get('message')}"
        for e in p.get("errors") or []
        if isinstance(e, dict)
    ]
    fail_problem(r.status_code, p.get("code"), p.get("detail") or p.get("title") or "", errors)


@contextlib.contextmanager
def api_errors() -> Iterator[None]:
    """Render the client library's errors as the command's failure (fail_problem)."""
    try:
        yield
    except ApiError as exc:
        fail_problem(exc.status, exc.code, exc.detail or exc.problem.get("title") or "")
    except TransportError as exc:
        fail(f"cannot reach the API: {exc}")
    except TierpointError as exc:
        fail(str(exc))
