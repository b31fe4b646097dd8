"""The `tierpoint` command (console script `tierpoint = apps.cli.main:app`)."""

import copy
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from apps.cli import (
    actions,
    checkpoints,
    context,
    demo,
    dev,
    failures,
    nodes,
    policy,
    quarantine,
    reconcile,
    removal,
    restore,
    serve,
    show,
    status,
    tokens,
    usage,
    watch,
)


def _set_token(ctx: typer.Context, param: Any, value: str | None) -> None:
    if value:
        context.set_token(value)


class _CommonOptions(TyperGroup):
    """`--token` works before the subcommand (`tierpoint --token T status`) and, like
    `--api-url` and `--data-dir`, after it (`tierpoint status --token T`): every command that
    talks to the API (it has `--api-url`) gets a copy of the top-level option."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        token = next(p for p in self.params if p.name == "token")
        _share(token, list(self.commands.values()))


def _share(option: Any, commands: list[Any]) -> None:
    # Any: typer's click classes are private (typer._click).
    for command in commands:
        subcommands = getattr(command, "commands", None)
        if subcommands is not None:
            _share(option, list(subcommands.values()))
            continue
        names = {p.name for p in command.params}
        if "api_url" in names and option.name not in names:
            shared = copy.copy(option)
            shared.expose_value = False  # the command's function takes no `token`
            shared.callback = _set_token
            command.params.append(shared)


app = typer.Typer(
    cls=_CommonOptions,
    name="tierpoint",
    help="Tiered checkpoint storage for large-model training: local SSD -> shared FS -> S3, "
    "verified at every hop.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)


@app.callback()
def _options(
    token: Annotated[
        str | None,
        typer.Option(
            "--token",
            help="API token of the client commands (else TIERPOINT_TOKEN, else the dev "
            "stack's stack.json). Prefer the variable: a flag shows in `ps`.",
            show_default=False,
        ),
    ] = None,
) -> None:
    context.set_token(token)


# Services.
app.command("dev")(dev.dev)
app.command("api")(serve.api)
app.command("worker")(serve.worker)
app.command("migrate")(serve.migrate)
# Against the REST API.
app.command("status")(status.status)
app.add_typer(checkpoints.app, name="checkpoints")
app.command("show")(show.show)
app.command("watch")(watch.watch)
app.command("retry")(actions.retry)
app.command("verify")(actions.verify)
app.command("pin")(actions.pin)
app.command("unpin")(actions.unpin)
app.add_typer(failures.failures, name="failures")
app.command("delete")(removal.delete)
app.add_typer(policy.app, name="policy")
app.command("restore")(restore.restore)
app.command("usage")(usage.usage)
app.command("quarantine")(quarantine.quarantine)
app.command("unquarantine")(quarantine.unquarantine)
app.command("reconcile")(reconcile.reconcile)
app.command("nodes")(nodes.nodes)
app.command("node-lost")(nodes.node_lost)
app.command("demo")(demo.demo)
# Against the catalog (so the first admin token can be made on a fresh install).
app.add_typer(tokens.app, name="token")
# More command groups register here: a module with its own typer.Typer,
# added with app.add_typer(module.app, name=...).

if __name__ == "__main__":
    app()
