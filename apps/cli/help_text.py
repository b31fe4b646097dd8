"""How `tierpoint ... --help` reads: every help text as written (`[[tiers]]` is TOML, not rich
markup to hide), each paragraph one sentence after another, wrapped to the terminal (not broken
where the docstring's lines end), flags without a value type (they take none), and `--version`.
"""

from __future__ import annotations

import inspect
from importlib.metadata import PackageNotFoundError, version
from typing import Annotated, Any

import typer
from rich.markup import escape

DISTRIBUTION = "tierpoint"

# Any: typer types its click objects with its vendored click, which it does not export.
Command = Any


def package_version() -> str:
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:  # a source tree that was never installed
        return "unknown (not installed)"


def _print_version(value: bool) -> None:
    if value:
        print(f"{DISTRIBUTION} {package_version()}")
        raise typer.Exit()


VersionOpt = Annotated[
    bool,
    typer.Option(
        "--version",
        help="Print tierpoint's version and exit.",
        callback=_print_version,
        is_eager=True,
        expose_value=True,
    ),
]


def _commands(command: Command) -> list[Command]:
    found = [command]
    for sub in (getattr(command, "commands", None) or {}).values():
        found += _commands(sub)
    return found


def prose(text: str) -> str:
    """Help text as typer's rich help shows it as written: each paragraph on one line (rich wraps
    it to the terminal; typer keeps a docstring's line breaks) and no bracket taken for markup."""
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(escape(" ".join(p.split())) for p in paragraphs)


def tidy(root: Command) -> None:
    """Every command's and option's help text as `prose`, and no value type for a flag: typer's
    rich help labels every flag `<bool>` (its plain help does not). Called once, on the built
    top-level command."""
    for command in _commands(root):
        if command.help:
            command.help = prose(command.help)
        # The help option is made on first use and kept (click caches it): make it now.
        options = [*command.params, command.get_help_option(typer.Context(command))]
        for option in options:
            if option is None:
                continue
            if getattr(option, "help", None):
                option.help = prose(option.help)
            if getattr(option, "is_flag", False):
                option.metavar = ""
