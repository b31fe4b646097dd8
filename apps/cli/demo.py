"""`tierpoint demo`: a simulated training job on the dev stack's nodes.

It writes checkpoints of random shards into the nodes' local roots (<root>/<job>/<step>/<path>),
registers each one through the REST API, and shows live how each becomes restorable tier by tier
(ssd -> lustre -> s3), then prints the latest restorable checkpoint and its restore plan.
"""

import os
import random
import re
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import crc32c
import typer
from rich.progress import BarColumn, DownloadColumn, Progress, Task, TaskID, TextColumn
from rich.table import Table
from rich.text import Text
from tierpoint_client import Checkpoint, Client, InvalidJobNameError, ShardSpec
from tierpoint_client.paths import NAME_RULE, validate_job_name

from apps.cli.context import ApiUrlOpt, DataDirOpt, api_errors, console, fail, token_for
from apps.cli.render import checkpoint_detail, human_bytes, plan_table, state_text
from apps.devstack.facts import DEFAULT_DATA_DIR, StackNotRunning, read_stack_info

# A tier is settled for the demo when it will not change without new work or an operator.
SETTLED = frozenset({"restorable", "failed", "expiring", "expired"})
FAILED = frozenset({"failed"})
CHUNK = 4 * 1024 * 1024
_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000**2, "mb": 1000**2}
_UNITS |= {"mib": 1024**2, "g": 1000**3, "gb": 1000**3, "gib": 1024**3}


def parse_size(text: str) -> int:
    """'4MiB' -> 4194304; accepts B, k/KB/KiB, M/MB/MiB, G/GB/GiB (case-insensitive)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise typer.BadParameter(f"not a size: {text!r} (e.g. 4MiB, 512KiB, 1000000)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def write_shard(path: Path, size: int, rng: random.Random) -> str:
    """Write `size` random bytes atomically (temp name, fsync, rename); returns their crc32c."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    crc = 0
    with open(tmp, "wb") as f:
        left = size
        while left:
            chunk = rng.randbytes(min(CHUNK, left))
            crc = crc32c.crc32c(chunk, crc)
            f.write(chunk)
            left -= len(chunk)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)
    return f"{crc:08x}"


def write_checkpoint(
    nodes: dict[str, str], job: str, step: int, count: int, size: int, rng: random.Random
) -> list[ShardSpec]:
    """Shards spread round-robin over the nodes, as data-parallel ranks would write them."""
    names = list(nodes)
    specs = []
    for i in range(count):
        node = names[i % len(names)]
        rel = f"model/rank-{i:05d}-of-{count:05d}.bin"
        crc = write_shard(Path(nodes[node]) / job / str(step) / rel, size, rng)
        specs.append(ShardSpec(path=rel, size=size, crc32c=crc, node=node))
    return specs


class _BytesColumn(DownloadColumn):
    """Bytes done/total for copy rows; the training row counts checkpoints instead."""

    def render(self, task: Task) -> Text:
        if task.fields.get("kind") == "training":
            return Text(
                f"{task.completed:.0f}/{task.total or 0:.0f} ckpts", style="progress.download"
            )
        return super().render(task)


@dataclass
class Tracked:
    step: int
    registered_at: float
    tasks: dict[str, TaskID] = field(default_factory=dict)
    # tier -> seconds from registration until the tier was first seen restorable
    restorable_after: dict[str, float] = field(default_factory=dict)
    last: Checkpoint | None = None

    @property
    def done(self) -> bool:
        return self.last is not None and all(t.state in SETTLED for t in self.last.tiers)

    @property
    def failed(self) -> list[str]:
        if self.last is None:
            return []
        bad = [f"{t.tier}: {t.state} ({t.reason})" for t in self.last.tiers if t.state in FAILED]
        if self.last.quarantine_reason:
            bad.append(f"quarantined: {self.last.quarantine_reason}")
        return bad


def _poll(
    client: Client, job: str, tracked: list[Tracked], progress: Progress, force: bool = False
) -> None:
    """Refresh the checkpoints still moving (all with `force`: retention may expire old copies
    after they settled) and their progress rows."""
    for t in tracked:
        if t.done and not force:
            continue
        cp = client.checkpoint(job, t.step)
        t.last = cp
        for tier in cp.tiers:
            p = tier.progress
            if tier.tier not in t.tasks:
                t.tasks[tier.tier] = progress.add_task(
                    f"step {t.step:>6}  {tier.tier:<8}", total=cp.total_bytes, state=""
                )
            task = t.tasks[tier.tier]
            state = state_text(tier.state)
            if p is not None and p.shards_total:
                state.append(f"  {p.shards_verified}/{p.shards_total} shards", style="dim")
            if tier.state == "restorable" and tier.tier not in t.restorable_after:
                t.restorable_after[tier.tier] = time.monotonic() - t.registered_at
            if tier.tier in t.restorable_after:
                state.append(f"  after {t.restorable_after[tier.tier]:.1f}s", style="dim")
            completed = p.bytes_done if p is not None else 0
            if tier.state == "restorable":
                completed = p.bytes_total if p is not None else cp.total_bytes
            progress.update(
                task,
                total=(p.bytes_total if p is not None and p.bytes_total else cp.total_bytes),
                completed=completed,
                state=state,
            )


def _summary(job: str, tracked: list[Tracked], tiers: list[str]) -> Table:
    table = Table(
        title=f"{job}: state per tier now (seconds from registration until it was restorable)",
        title_justify="left",
    )
    table.add_column("step", justify="right", style="bold")
    table.add_column("size", justify="right")
    for tier in tiers:
        table.add_column(tier)
    for t in tracked:
        cells = []
        for tier in tiers:
            ts = t.last.tier(tier) if t.last else None
            cell = state_text(ts.state if ts else None)
            if tier in t.restorable_after:
                cell.append(f" {t.restorable_after[tier]:.1f}s", style="dim")
            cells.append(cell)
        size = human_bytes(t.last.total_bytes) if t.last else "-"
        table.add_row(str(t.step), size, *cells)
    return table


def _job_name(job: str | None) -> str | None:
    """The server's rule, before a shard is written under <root>/<job>/."""
    try:
        return None if job is None else validate_job_name(job)
    except InvalidJobNameError as exc:
        raise typer.BadParameter(str(exc)) from None


JobOpt = Annotated[
    str | None,
    typer.Option(
        help=f"Job name: {NAME_RULE}.", show_default="demo-<time>-<random>", callback=_job_name
    ),
]


def demo(
    checkpoints: Annotated[int, typer.Option(min=1, help="Checkpoints to write.")] = 3,
    shards: Annotated[int, typer.Option(min=1, help="Shards per checkpoint.")] = 4,
    shard_size: Annotated[str, typer.Option(help="Bytes per shard (4MiB, 512KiB, ...).")] = "4MiB",
    job: JobOpt = None,
    steps_between: Annotated[int, typer.Option(min=1, help="Training steps per checkpoint.")] = 100,
    interval: Annotated[
        float, typer.Option(min=0, help="Seconds of 'training' between checkpoints.")
    ] = 1.0,
    timeout: Annotated[
        float, typer.Option(min=1, help="Give up if not every tier settles within this.")
    ] = 600.0,
    seed: Annotated[int | None, typer.Option(help="Seed for the random shard bytes.")] = None,
    api_url: ApiUrlOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR,
) -> None:
    """Simulate a training job on the dev stack and watch its checkpoints become restorable.

    Writes checkpoints of random shards into the nodes' local roots, registers them, follows each
    one ssd -> lustre -> s3, and prints the latest restorable checkpoint with its restore plan.
    """
    size = parse_size(shard_size)
    try:
        info = read_stack_info(data_dir)
    except StackNotRunning as exc:
        fail(str(exc))
    url = (api_url or info.api_url).rstrip("/")
    client = Client(url, token=token_for(info))
    job = job or f"demo-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
    rng = random.Random(seed)
    tracked: list[Tracked] = []
    console.print(
        f"[bold]{job}[/]: {checkpoints} checkpoints of {shards} x {human_bytes(size)} shards "
        f"on {', '.join(info.nodes)}; API {url}"
    )
    with api_errors():
        tiers = [t.name for t in client.tiers()]
        columns = (
            TextColumn("{task.description}"),
            BarColumn(bar_width=30),
            _BytesColumn(binary_units=True),
            TextColumn("{task.fields[state]}"),
        )
        with Progress(*columns, console=console, refresh_per_second=8) as progress:
            training = progress.add_task("training", total=checkpoints, state="", kind="training")
            for k in range(checkpoints):
                step = (k + 1) * steps_between
                progress.update(training, state=f"writing step {step}")
                specs = write_checkpoint(info.nodes, job, step, shards, size, rng)
                t0 = time.monotonic()
                client.register_manifest(
                    job, step, specs, metadata={"loss": round(2.5 / (k + 1), 4), "demo": True}
                )
                ack_ms = (time.monotonic() - t0) * 1000
                tracked.append(Tracked(step=step, registered_at=time.monotonic()))
                progress.update(
                    training,
                    advance=1,
                    state=f"registered step {step} ({ack_ms:.0f} ms); training ...",
                )
                end = time.monotonic() + interval
                while time.monotonic() < end:
                    _poll(client, job, tracked, progress)
                    time.sleep(0.25)
            progress.update(training, state="done; waiting for every tier")
            deadline = time.monotonic() + timeout
            while not all(t.done for t in tracked) and time.monotonic() < deadline:
                _poll(client, job, tracked, progress)
                time.sleep(0.25)
            _poll(client, job, tracked, progress, force=True)

        console.print(_summary(job, tracked, tiers))
        failures = {t.step: t.failed for t in tracked if t.failed}
        unsettled = [t.step for t in tracked if not t.done]
        latest = client.latest(job)
    if latest is None:
        console.print("[bold red]no checkpoint of this job is restorable[/]")
    else:
        console.print(
            f"latest restorable: [bold]{job}[/] step [bold cyan]{latest.step}[/] "
            f"(restorable on {', '.join(latest.checkpoint.restorable_tiers())})"
        )
        console.print(plan_table(latest))
        console.print(
            # Under .tierpoint/ as the README's restore: a checkout's .gitignore covers it.
            f"restore it: [bold]tierpoint restore {job} .tierpoint/restored --data-dir "
            f"{data_dir}[/]"
        )
    for step, reasons in failures.items():
        bad = next(t.last for t in tracked if t.step == step)
        if bad is not None:
            console.print(checkpoint_detail(bad))
        console.print(f"[bold red]step {step} failed:[/] {'; '.join(reasons)}")
    if unsettled:
        console.print(f"[bold red]not settled after {timeout:.0f}s:[/] steps {unsettled}")
    if failures or unsettled or latest is None:
        raise typer.Exit(1)
