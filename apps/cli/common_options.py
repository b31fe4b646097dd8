"""The options that say where the API is and who is asking: `--data-dir`, `--api-url` and
`--token`, taken before the subcommand as after it (`tierpoint --data-dir D checkpoints list J`
is `tierpoint checkpoints list J --data-dir D`).

The top-level command declares each of them once; every command (at any depth of the groups)
that takes one gets the top-level value when its own flag was not given: a flag after the
subcommand wins over one before it, and either over the environment (TIERPOINT_DATA_DIR, ...)
and the default. A command that takes none of it refuses it, rather than ignore where the user
pointed it (`tierpoint --api-url U dev`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from apps.cli import context

# Any: typer types its click objects with its vendored click, which it does not export.
Command = Any
Param = Any
Ctx = Any

# Parameter names of the shared options, and their flags.
SHARED = {"data_dir": "--data-dir", "api_url": "--api-url", "token": "--token"}

TokenOpt = Annotated[
    str | None,
    typer.Option(
        "--token",
        help="API token of the client commands (else TIERPOINT_TOKEN, else the dev "
        "stack's stack.json). Prefer the variable: a flag shows in `ps`.",
        show_default=False,
    ),
]
RootDataDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--data-dir",
        help="Data dir of a `tierpoint dev` stack, for every command (else TIERPOINT_DATA_DIR, "
        "else .tierpoint/dev).",
        show_default=False,
    ),
]
RootApiUrlOpt = Annotated[
    str | None,
    typer.Option(
        "--api-url",
        help="tierpoint API base URL, for every client command (else TIERPOINT_API_URL, else "
        "the dev stack's stack.json).",
        show_default=False,
    ),
]


def _given(ctx: Ctx, name: str) -> bool:
    source = ctx.get_parameter_source(name)
    return source is not None and source.name == "COMMANDLINE"


def _leaves(command: Command) -> Iterator[Command]:
    subcommands = getattr(command, "commands", None)
    if subcommands is None:
        yield command
        return
    for sub in subcommands.values():
        yield from _leaves(sub)


def _top_level_unless_given(own: Callable[..., Any] | None) -> Callable[..., Any]:
    """The callback of a command's own option: the top-level value when the command's flag was
    not given and the top-level one was."""

    def resolve(ctx: typer.Context, param: Param, value: Any) -> Any:
        root = ctx.find_root()
        if root is not ctx and not _given(ctx, param.name) and _given(root, param.name):
            value = root.params[param.name]
        return own(ctx, param, value) if own is not None else value

    return resolve


def _set_token(ctx: typer.Context, param: Param, value: str | None) -> None:
    if value:
        context.set_token(value)


def _refuse(ctx: typer.Context, param: Param, value: Any) -> None:
    root = ctx.find_root()
    if _given(root, param.name) or _given(ctx, param.name):
        ctx.fail(f"`{ctx.command_path}` takes no {SHARED[param.name]}")


def share(root: Command) -> None:
    """Give every command below `root` the top-level values of the shared options (see the
    module's docstring). Called once, on the built top-level command."""
    shared = {p.name: p for p in root.params if p.name in SHARED}
    for leaf in _leaves(root):
        names = {p.name for p in leaf.params}
        for name, option in shared.items():
            own = next((p for p in leaf.params if p.name == name), None)
            if own is not None:
                own.callback = _top_level_unless_given(own.callback)
                continue
            added = copy.copy(option)
            added.expose_value = False  # the command's function has no such argument
            if name == "token" and "api_url" in names:
                added.callback = _set_token  # `status --token T`: the client commands' token
            else:
                added.callback = _refuse
                added.hidden = True
            leaf.params.append(added)
