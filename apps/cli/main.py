"""The `tierpoint` command (console script `tierpoint = apps.cli.main:app`)."""

from typing import Any

import typer
from typer.core import TyperGroup

from apps.cli import (
    actions,
    checkpoints,
    common_options,
    context,
    demo,
    dev,
    failures,
    help_text,
    nodes,
    policy,
    quarantine,
    reconcile,
    removal,
    restore,
    serve,
    show,
    status,
    timeline,
    tokens,
    usage,
    watch,
)


class _Root(TyperGroup):
    """The top-level command: its `--data-dir`, `--api-url` and `--token` reach every command
    that takes them (common_options.py); every command's help reads as help_text.py says."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        common_options.share(self)
        help_text.tidy(self)


app = typer.Typer(
    cls=_Root,
    name="tierpoint",
    help="Tiered checkpoint storage for large-model training: local SSD -> shared FS -> S3, "
    "verified at every hop.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)


@app.callback()
def _options(
    token: common_options.TokenOpt = None,
    data_dir: common_options.RootDataDirOpt = None,
    api_url: common_options.RootApiUrlOpt = None,
    version: help_text.VersionOpt = False,
) -> None:
    # The commands read --data-dir and --api-url as their own (common_options.share).
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
app.command("rollback")(timeline.rollback)
app.command("branches")(timeline.branches)
app.command("verdict")(timeline.verdict)
app.command("fork")(timeline.fork)
app.command("lineage")(timeline.lineage)
app.command("reconcile")(reconcile.reconcile)
app.command("nodes")(nodes.nodes)
app.command("node-lost")(nodes.node_lost)
app.command("demo")(demo.demo)
# Against the catalog (so the first admin token can be made on a fresh install).
app.add_typer(tokens.app, name="token")
# More command groups register here: a module with its own typer.Typer,
# added with app.add_typer(module.app, name=...).

if __name__ == "__main__":
    app(prog_name="tierpoint")  # as the console script names itself, not `python -m ...`
