"""The `tierpoint` command (console script `tierpoint = tierpoint.cli.main:app`)."""

import typer

from tierpoint.cli import checkpoints, demo, dev, nodes, policy, restore, serve, status

app = typer.Typer(
    name="tierpoint",
    help="Tiered checkpoint storage for large-model training: local SSD -> shared FS -> S3, "
    "verified at every hop.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)

# Services.
app.command("dev")(dev.dev)
app.command("api")(serve.api)
app.command("worker")(serve.worker)
app.command("migrate")(serve.migrate)
# Against the REST API.
app.command("status")(status.status)
app.add_typer(checkpoints.app, name="checkpoints")
app.add_typer(policy.app, name="policy")
app.command("restore")(restore.restore)
app.command("node-lost")(nodes.node_lost)
app.command("demo")(demo.demo)
# More command groups (e.g. `policy`, `token`) register here: a module with its own typer.Typer,
# added with app.add_typer(module.app, name=...).

if __name__ == "__main__":
    app()
