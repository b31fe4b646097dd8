"""Rich renderings of the operator views' JSON (`/v1/overview/jobs`, `/v1/copies/in-flight`,
`/v1/failures`, `/v1/tiers/usage`, a checkpoint's events), shared by `status`, `show` and
`watch`."""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime
from typing import Any

from rich.table import Table
from rich.text import Text

from apps.cli.render import dollars, human_bytes, state_text


def print_json(data: Any) -> None:
    """The API's JSON as it came, unwrapped and uncoloured: for jq and scripts."""
    print(json.dumps(data, indent=2))


def ago(seconds: float | None) -> str:
    """2d3h, 4h12m, 7m30s, 42s: an age or duration at a glance."""
    if seconds is None:
        return "-"
    s = int(max(seconds, 0))
    for unit, size, sub, subsize in (("d", 86400, "h", 3600), ("h", 3600, "m", 60)):
        if s >= size:
            return f"{s // size}{unit}{(s % size) // subsize}{sub}"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def stamp(iso: str | None) -> str:
    if not iso:
        return "-"
    return datetime.fromisoformat(iso).astimezone().strftime("%Y-%m-%d %H:%M:%S")


def _point(p: dict[str, Any]) -> Text:
    if p["latest_step"] is None:
        return Text("none", style="bold red" if p["checkpoints"] else "dim")
    cell = Text(f"step {p['latest_step']}", style="green")
    behind = p.get("steps_behind")
    cell.append(f" {ago(p.get('age_seconds'))} old", style="dim")
    if behind:
        cell.append(f" ({behind} steps behind)", style="yellow")
    restore = p.get("predicted_restore_seconds")
    if restore is not None:
        # Under a second, "~0s" reads as "nothing to read".
        cell.append(", restore <1s" if restore < 1 else f", restore ~{ago(restore)}", style="dim")
    return cell


def at_risk(job: dict[str, Any]) -> Text:
    """Steps trained since the newest checkpoint durable on the last tier / restorable anywhere:
    what a loss of the nodes, or of everything but the last tier, would cost."""
    if job["latest_step"] is None:
        return Text("-", style="dim")
    durable, anywhere = job.get("steps_at_risk_durable"), job.get("steps_at_risk")

    def part(n: int | None) -> Text:
        if n is None:
            return Text("all", style="bold red")
        return Text(str(n), style="yellow" if n else "green")

    return Text.assemble(part(durable), " / ", part(anywhere))


def counted(what: str, page: dict[str, Any]) -> str:
    """A list's title with its count: "failures (20 of 22)" when the list is cut."""
    shown = len(page["items"])
    total = page.get("total", shown)
    return f"{what} ({shown} of {total})" if total > shown else f"{what} ({shown})"


def jobs_table(overview: dict[str, Any]) -> Table:
    """One row per job: its recovery point on every tier (the step a restart from that tier
    would resume at, and how old it is), in flight, failed, cost."""
    items = overview["items"]
    tiers = [t["tier"] for t in items[0]["tiers"]] if items else []
    title = f"{counted('jobs', overview)}: recovery point per tier"
    table = Table(title=title, title_justify="left")
    table.add_column("job", style="bold")
    table.add_column("latest", justify="right")
    table.add_column("steps at risk\n(durable / any)", justify="right")
    for tier in tiers:
        table.add_column(tier)
    table.add_column("in flight", justify="right")
    table.add_column("failed", justify="right")
    table.add_column("$/month", justify="right")
    for j in items:
        table.add_row(
            j["job"],
            "-" if j["latest_step"] is None else str(j["latest_step"]),
            at_risk(j),
            *(_point(p) for p in j["tiers"]),
            str(j["in_flight"]) if j["in_flight"] else "",
            Text(str(j["failed"]), style="bold red") if j["failed"] else Text(""),
            dollars(j["monthly_cost"]),
        )
    return table


def percent(done: int, total: int) -> int:
    return 100 if total <= 0 else min(100, 100 * done // total)


def rate(bps: float | None) -> str:
    return "-" if bps is None else f"{human_bytes(int(bps))}/s"


def in_flight_table(flights: dict[str, Any]) -> Table:
    table = Table(title=counted("copies in flight", flights), title_justify="left")
    for col in ("job", "step", "tier", "progress", "shards", "rate", "eta", "waiting since"):
        table.add_column(col, justify="right" if col in ("step", "rate", "eta") else "left")
    for c in flights["items"]:
        progress = (
            f"{percent(c['bytes_done'], c['bytes_total']):3d}% "
            f"{human_bytes(c['bytes_done'])} / {human_bytes(c['bytes_total'])}"
        )
        table.add_row(
            c["job"],
            str(c["step"]),
            c["tier"],
            progress,
            f"{c['shards_verified']}/{c['shards_total']}",
            rate(c["bytes_per_second"]),
            ago(c["eta_seconds"]) if c["eta_seconds"] is not None else "-",
            f"{ago(c['elapsed_seconds'])} ago",
        )
    return table


def failures_table(failures: dict[str, Any]) -> Table:
    table = Table(title=counted("failures", failures), title_justify="left")
    for col in ("job", "step", "tier", "failed at", "reason", "retry"):
        table.add_column(col, overflow="fold")
    for f in failures["items"]:
        reason = Text(f["reason"] or "", style="red")
        if f.get("last_error") and f["last_error"] not in (f["reason"] or ""):
            reason.append(f"\nlast error: {f['last_error']}", style="dim")
        table.add_row(
            f["job"], str(f["step"]), f["tier"], stamp(f["failed_at"]), reason, retry_hint(f)
        )
    return table


def retry_hint(f: dict[str, Any]) -> Text:
    """What to do about a failure: the retry command where a retry can help, else why not."""
    refused = f.get("retry_refused")
    if refused is None:
        return Text(f"tierpoint retry {f['job']} {f['step']}", style="cyan")
    why = refused.get("why") or refused["detail"]  # an API before `why` sent the detail only
    return Text(f"no retry can help: {why} ({refused['code']})", style="dim")


def acknowledge_hint(failures: dict[str, Any]) -> Text | None:
    """How to clear the failures no retry can help, when the list has any."""
    if all(f.get("retryable", True) for f in failures["items"]):
        return None
    return Text(
        "failures no retry can help: acknowledge them with `tierpoint failures ack JOB [STEP]` "
        "or `tierpoint failures ack --reason TEXT` (see `tierpoint failures list`)",
        style="dim",
    )


def usage_table(usage: dict[str, Any]) -> Table:
    table = Table(title="tiers", title_justify="left")
    for col in ("tier", "kind", "bytes", "held", "checkpoints", "free", "$/month", "largest jobs"):
        table.add_column(col, justify="right" if col in ("bytes", "held", "$/month") else "left")
    for t in usage["items"]:
        free = "-"
        if t["free_bytes"] is not None and t["capacity_bytes"]:
            free = (
                f"{human_bytes(t['free_bytes'])} of {human_bytes(t['capacity_bytes'])} "
                f"({100 * t['free_bytes'] // t['capacity_bytes']}%)"
            )
        top = ", ".join(f"{j['job']} {human_bytes(j['bytes'])}" for j in t["jobs"][:3])
        # A coded tier holds its stripes, (k+m)/k of the files' bytes (an older API: the bytes).
        held = t.get("held_bytes", t["bytes"])
        table.add_row(
            t["tier"],
            f"{t['kind']} {t['code']}" if t.get("code") else t["kind"],
            human_bytes(t["bytes"]),
            human_bytes(held),
            str(t["checkpoints"]),
            free,
            dollars(t["monthly_cost"]),
            top,
        )
    return table


def coverage_text(c: dict[str, Any]) -> Text:
    """A coded copy's sets in a line: '<code>: W whole, D degraded (S stripes short), B below
    k, margin N' (the parts that are zero left out, margin always), red below k, yellow while
    degraded."""
    parts = [f"{c['whole']} whole"]
    if c["degraded"]:
        parts.append(f"{c['degraded']} degraded ({c['stripes_short']} stripes short)")
    if c["below_k"]:
        parts.append(f"{c['below_k']} below k")
    margin = c["least_margin"]
    parts.append(f"margin {'-' if margin is None else margin}")
    style = "bold red" if c["below_k"] else "yellow" if c["degraded"] else ""
    return Text(f"{c['code']} stripes: " + ", ".join(parts), style=style)


def checkpoint_tiers_table(cp: dict[str, Any]) -> Table:
    """Per tier: state, progress, replicas by state (from the shards; a coded copy's coverage of
    its sets), when restorable, why not."""
    replicas: dict[str, Counter[str]] = {t["tier"]: Counter() for t in cp["tiers"]}
    for s in cp.get("shards") or []:
        for r in s["replicas"]:
            replicas.setdefault(r["tier"], Counter())[r["state"]] += 1
    table = Table(title=f"{cp['job']} step {cp['step']}: tiers", title_justify="left")
    for col in ("tier", "kind", "state", "shards verified", "bytes", "replicas", "restorable at"):
        table.add_column(col)
    table.add_column("reason", overflow="fold")
    for t in cp["tiers"]:
        p = t["progress"]
        reason = Text(t["reason"] or "")
        state = state_text(t["state"])
        # A quarantine of the whole checkpoint covers every tier (as apps/cli/render.py).
        why = t["quarantine_reason"] or cp.get("quarantine_reason")
        if why:
            where = "" if t["quarantine_reason"] else "checkpoint "
            reason.append(f"{where}quarantined: {why}", style="bold red")
            state.append(" (quarantined)", style="bold red")
        counts = replicas.get(t["tier"]) or Counter()
        held = Text(", ".join(f"{n} {st}" for st, n in sorted(counts.items())) or "-")
        if t.get("coverage"):
            held = coverage_text(t["coverage"])
        table.add_row(
            t["tier"],
            t["kind"] or "-",
            state,
            f"{p['shards_verified']}/{p['shards_total']}",
            f"{human_bytes(p['bytes_done'])} / {human_bytes(p['bytes_total'])}",
            held,
            stamp(t["restorable_at"]),
            reason,
        )
    return table


def shards_table(cp: dict[str, Any]) -> Table:
    """Every shard with its replica's state per tier (and the replica's error)."""
    tiers = [t["tier"] for t in cp["tiers"]]
    table = Table(title=f"{cp['job']} step {cp['step']}: shards", title_justify="left")
    for col in ("path", "size", "crc32c", "node", *tiers):
        table.add_column(col, overflow="fold")
    for s in cp.get("shards") or []:
        replicas = {r["tier"]: r for r in s["replicas"]}
        cells = []
        for tier in tiers:
            r = replicas.get(tier)
            cell = state_text(r["state"] if r else None)
            if r is not None and r.get("error"):
                cell.append(f" ({r['error']})", style="red")
            cells.append(cell)
        table.add_row(s["path"], human_bytes(s["size"]), s["crc32c"] or "-", s["node"], *cells)
    return table


def stripes_table(cp: dict[str, Any], tier: str, shards: list[dict[str, Any]]) -> Table:
    """A coded copy's stripes: one row per shard, one column per stripe index, each cell the
    holder and the stripe's state; a stripe that does not count (not verified, or on a holder
    declared lost) is marked."""
    width = max((s["index"] + 1 for sh in shards for s in sh["stripes"]), default=0)
    title = f"{cp['job']} step {cp['step']}: stripes on {tier}"
    table = Table(title=title, title_justify="left")
    table.add_column("path", overflow="fold")
    table.add_column("code")
    for i in range(width):
        table.add_column(f"stripe {i}", overflow="fold")
    for sh in shards:
        by_index = {s["index"]: s for s in sh["stripes"]}
        cells = []
        for i in range(width):
            s = by_index.get(i)
            if s is None:
                cells.append(Text("not held", style="red"))
                continue
            cell = Text(f"{s['node']} ")
            cell.append_text(state_text(s["state"]))
            if s["holder_lost"]:
                cell.append(" (holder lost)", style="bold red")
            cells.append(cell)
        table.add_row(sh["path"], sh["code"] or "-", *cells)
    return table


def _event_detail(d: dict[str, Any]) -> str:
    parts = []
    for k, v in d.items():
        if isinstance(v, list | dict):
            v = json.dumps(v, separators=(",", ":"))
        parts.append(f"{k}={v}")
    return " ".join(parts)


def events_table(events: list[dict[str, Any]], title: str) -> Table:
    table = Table(title=title, title_justify="left")
    for col in ("when", "event", "tier", "actor"):
        table.add_column(col)
    table.add_column("detail", overflow="fold")
    for e in events:
        table.add_row(
            stamp(e["created_at"]),
            state_text(e["kind"]) if e["kind"] in ("corrupt", "failed", "lost") else e["kind"],
            e["tier"] or "",
            e["actor"] or "",
            _event_detail(e["detail"]),
        )
    return table
