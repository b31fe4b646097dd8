"""Rich renderings of API answers, shared by `checkpoints`, `demo` and `restore`."""

import json
from collections.abc import Sequence
from datetime import datetime

from rich.console import Group
from rich.table import Table
from rich.text import Text
from tierpoint_client import Checkpoint, LatestCheckpoint, TierCopy

STATE_STYLES = {
    "restorable": "bold green",
    "verified": "green",
    "pending": "yellow",
    "copying": "cyan",
    "failed": "bold red",
    "corrupt": "bold red",
    "lost": "red",
    "expiring": "magenta",
    "expired": "dim",
}


def state_text(state: str | None) -> Text:
    if state is None:
        return Text("-", style="dim")
    return Text(state, style=STATE_STYLES.get(state, ""))


def dollars(amount: float) -> str:
    """US dollars to the cent, or to a tenth of a cent below a dollar (small test jobs)."""
    sign = "-" if amount < 0 else ""
    a = abs(amount)
    return f"{sign}${a:,.2f}" if a >= 1 else f"{sign}${a:.3f}"


def human_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def when(dt: datetime | None) -> str:
    return dt.astimezone().strftime("%Y-%m-%d %H:%M:%S") if dt else "-"


def tier_cell(t: TierCopy | None) -> Text:
    if t is None:
        return Text("-", style="dim")
    cell = state_text(t.state)
    p = t.progress
    if t.state == "pending" and p is not None and p.bytes_total:
        cell.append(f" {100 * p.bytes_done // p.bytes_total}%", style="dim")
    return cell


def checkpoints_table(job: str, items: Sequence[Checkpoint], tiers: Sequence[str]) -> Table:
    table = Table(title=f"checkpoints of {job}", title_justify="left")
    table.add_column("step", justify="right", style="bold")
    table.add_column("created")
    table.add_column("size", justify="right")
    table.add_column("shards", justify="right")
    for tier in tiers:
        table.add_column(tier)
    table.add_column("notes")
    for cp in items:
        notes = []
        if cp.pinned:
            notes.append("pinned")
        if cp.quarantine_reason:
            notes.append(f"quarantined: {cp.quarantine_reason}")
        table.add_row(
            str(cp.step),
            when(cp.created_at),
            human_bytes(cp.total_bytes),
            str(cp.shard_count),
            *(tier_cell(cp.tier(t)) for t in tiers),
            ", ".join(notes),
        )
    return table


def tiers_table(cp: Checkpoint) -> Table:
    table = Table(title=f"{cp.job} step {cp.step}: tiers", title_justify="left")
    for col in ("tier", "kind", "state", "shards verified", "bytes", "restorable at", "reason"):
        table.add_column(col)
    for t in cp.tiers:
        p = t.progress
        shards = f"{p.shards_verified}/{p.shards_total}" if p else "-"
        done = f"{human_bytes(p.bytes_done)} / {human_bytes(p.bytes_total)}" if p else "-"
        reason = Text(t.reason or "")
        state = state_text(t.state)
        # A quarantine of the whole checkpoint covers every tier: a restorable copy is not
        # offered, and the table says so where the state is.
        why = t.quarantine_reason or cp.quarantine_reason
        if why:
            reason.append(
                f"{'' if t.quarantine_reason else 'checkpoint '}quarantined: {why}",
                style="bold red",
            )
            state.append(" (quarantined)", style="bold red")
        table.add_row(t.tier, t.kind, state, shards, done, when(t.restorable_at), reason)
    return table


def shards_table(cp: Checkpoint) -> Table:
    tiers = [t.tier for t in cp.tiers]
    table = Table(title=f"{cp.job} step {cp.step}: shards", title_justify="left")
    for col in ("path", "size", "crc32c", "node", *tiers):
        table.add_column(col)
    for s in cp.shards or ():
        replicas = {r.tier: r for r in s.replicas}
        cells = []
        for tier in tiers:
            r = replicas.get(tier)
            cell = state_text(r.state if r else None)
            if r is not None and r.error:
                cell.append(f" ({r.error})", style="red")
            cells.append(cell)
        table.add_row(s.path, human_bytes(s.size), s.crc32c or "-", s.node, *cells)
    return table


def checkpoint_detail(cp: Checkpoint) -> Group:
    head = Text.assemble(
        (f"{cp.job} ", "bold"),
        (f"step {cp.step}", "bold cyan"),
        f"  {human_bytes(cp.total_bytes)} in {cp.shard_count} shards,"
        f" created {when(cp.created_at)}",
    )
    if cp.pinned:
        head.append("  pinned", style="bold")
    if cp.quarantine_reason:
        head.append(f"  quarantined: {cp.quarantine_reason}", style="bold red")
    parts: list[Text | Table] = [head, tiers_table(cp)]
    if cp.shards:
        parts.append(shards_table(cp))
    if cp.metadata:
        metadata = json.dumps(cp.metadata, ensure_ascii=False)
        parts.append(Text(f"metadata: {metadata}", style="dim"))
    return Group(*parts)


def plan_table(latest: LatestCheckpoint) -> Group:
    table = Table(
        title=f"restore plan: {latest.job} step {latest.step} "
        f"({human_bytes(latest.total_bytes)} in {len(latest.plan)} shards)",
        title_justify="left",
    )
    for col in ("path", "size", "crc32c", "tier", "node", "location"):
        table.add_column(col, overflow="fold")
    for e in latest.plan:
        table.add_row(
            e.path, human_bytes(e.size), e.crc32c or "-", e.tier, e.node or "-", e.location
        )
    parts: list[Text | Table] = [table]
    for s in latest.skipped:
        parts.append(Text(f"skipped newer step {s.step}: {'; '.join(s.reasons)}", style="yellow"))
    return Group(*parts)
