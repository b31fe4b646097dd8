"""What every scenario shares: methods run interleaved and rotated with their baselines, the
median/min/max of each reported timing, ratios to a baseline measured in the same run, the CPU
each watched process spent (which one was saturated), a rich table and a JSON document.

A scenario prepares its data once and returns its methods. A method is one way of doing the
work; one run of it yields named timings (`Outcome.metrics`, seconds). A `Row` is one timing of one
method as the table shows it, optionally compared to another row (its baseline): ratio =
median / baseline median, so below 1 is faster than the baseline.

A run that raises is a failed run, reported with its error beside the other methods' numbers
(its rows' medians are those of the runs that did not fail, none when all did); the other
methods and rounds run on. A run may also fail in part (`Outcome.failed`: one measurement of
several, such as a restart storm after a checkpoint's costs): then only the rows of that part
fail, and the run's other rows keep their numbers. A measurement that fails is a result too,
never the end of the run.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

from benchmarks.procs import cpu_seconds

# label -> (pid, whether its descendants count too)
Watched = Mapping[str, tuple[int, bool]]


@dataclass(frozen=True)
class Row:
    label: str
    metric: str = "seconds"
    baseline: str | None = None  # the label of the row this one is compared to
    nbytes: int | None = None  # bytes moved per run: the table adds MB/s
    # "s", "ms" for latencies already in milliseconds, "MiB" (peak RSS), "n" for counts
    unit: str = "s"


@dataclass
class Outcome:
    metrics: dict[str, float]
    # CPU seconds the method's own processes spent, when they report it themselves.
    cpu: dict[str, float] = field(default_factory=dict)
    rss_mib: float | None = None
    # Parts of the run that failed: metric prefix -> error. A row whose metric starts with the
    # prefix (and that the run did not measure) failed in this run; the others did not.
    failed: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Method:
    name: str
    run: Callable[[], Outcome]
    rows: tuple[Row, ...]
    before: Callable[[], None] | None = None  # untimed: drop caches, empty a bucket
    after: Callable[[], None] | None = None  # untimed: let background work settle


class Scenario:
    """Subclasses set `name` and `summary`, prepare their data in `prepare`, clean up in `close`."""

    name: str = ""
    summary: str = ""

    def prepare(self) -> list[Method]:
        raise NotImplementedError

    def params(self) -> dict[str, Any]:
        return {}

    def watched(self) -> Watched:
        return {}

    def close(self) -> None:
        pass


@dataclass
class Run:
    method: str
    outcome: Outcome | None  # None: the run failed
    wall: float  # the run's own span, for CPU seconds -> cores
    cpu: dict[str, float]
    error: str | None = None  # why it failed: the exception's type and message


def error_text(exc: BaseException) -> str:
    """An exception as a failed row shows it: its type and the first line of its message."""
    first = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {first[0][:300]}" if first else type(exc).__name__


def _cpu(watched: Watched) -> dict[str, float]:
    return {label: cpu_seconds(pid, tree=tree) for label, (pid, tree) in watched.items()}


def run_methods(
    methods: list[Method],
    repeats: int,
    watched: Callable[[], Watched],
    step: Callable[[str], None] = lambda _: None,
    done: Callable[[], None] = lambda: None,
) -> list[Run]:
    """Every method `repeats` times, round by round, the order rotated each round: drifting load
    and the after-effects of the previous run (freed blocks, writeback) hit every method alike."""
    runs: list[Run] = []
    for r in range(repeats):
        k = r % len(methods)
        for m in methods[k:] + methods[:k]:
            step(m.name)
            runs.append(_run_once(m, watched))
            done()
    return runs


def _run_once(m: Method, watched: Callable[[], Watched]) -> Run:
    """One run of `m`, its untimed steps included; a failure in any of them is the run's."""
    t0 = time.perf_counter()
    try:
        if m.before is not None:
            m.before()
        w = watched()
        before = _cpu(w)
        t0 = time.perf_counter()
        outcome = m.run()
        wall = time.perf_counter() - t0
        after = _cpu(w)
        cpu = {k: after[k] - before[k] for k in w}
        cpu.update(outcome.cpu)
        if m.after is not None:
            m.after()
    except Exception as exc:
        return Run(m.name, None, time.perf_counter() - t0, {}, error_text(exc))
    return Run(m.name, outcome, wall, cpu)


def _cores(runs: list[Run]) -> dict[str, float]:
    """Median cores each process kept busy over the method's runs (CPU seconds / wall)."""
    labels = {k for r in runs for k in r.cpu}
    return {
        k: round(statistics.median(r.cpu.get(k, 0.0) / max(r.wall, 1e-9) for r in runs), 3)
        for k in sorted(labels)
    }


def _part_error(run: Run, metric: str) -> str | None:
    """Why `run` has no value for `metric`: the run's error, or that of its failed part."""
    if run.outcome is None:
        return run.error
    if metric in run.outcome.metrics:
        return None
    for prefix, error in run.outcome.failed.items():
        if metric.startswith(prefix):
            return error
    raise KeyError(f"{run.method}: the run measured no {metric!r} and no part of it failed")


def _failures(runs: list[Run], metric: str) -> str | None:
    """'k of n runs failed: <first error>' for the row of `metric`, or None when none did."""
    errors = [e for r in runs if (e := _part_error(r, metric)) is not None]
    if not errors:
        return None
    return f"{len(errors)} of {len(runs)} runs failed: {errors[0]}"


def _row(m: Method, row: Row, ok: list[Run], failed: str | None) -> dict[str, Any]:
    values = [
        r.outcome.metrics[row.metric]
        for r in ok
        if r.outcome is not None and row.metric in r.outcome.metrics
    ]
    median = statistics.median(values) if values else None
    rss = [r.outcome.rss_mib for r in ok if r.outcome is not None and r.outcome.rss_mib is not None]
    return {
        "label": row.label,
        "method": m.name,
        "metric": row.metric,
        "unit": row.unit,
        "baseline": row.baseline,
        "values": values,
        "median": median,
        "min": min(values) if values else None,
        "max": max(values) if values else None,
        "mb_per_s": row.nbytes / median / 1e6 if row.nbytes and median else None,
        "cpu_cores": _cores(ok),
        "peak_rss_mib": max(rss) if rss else None,
        "failed": failed,
    }


def summarize(scenario: Scenario, methods: list[Method], runs: list[Run]) -> dict[str, Any]:
    by_method = {m.name: [r for r in runs if r.method == m.name] for m in methods}
    rows: list[dict[str, Any]] = []
    for m in methods:
        mine = by_method[m.name]
        ok = [r for r in mine if r.outcome is not None]
        rows += [_row(m, row, ok, _failures(mine, row.metric)) for row in m.rows]
    medians = {r["label"]: r["median"] for r in rows}
    for r in rows:
        base = r["baseline"]
        r["ratio"] = None
        if base is not None:
            if base not in medians:
                raise ValueError(f"{scenario.name}: row {r['label']!r} names no row {base!r}")
            if r["median"] is not None and medians[base]:
                r["ratio"] = r["median"] / medians[base]
    return {"summary": scenario.summary, "params": scenario.params(), "rows": rows}


def failed_scenario(scenario: Scenario, error: BaseException) -> dict[str, Any]:
    """A scenario whose preparation failed: reported with its error, no rows."""
    return {
        "summary": scenario.summary,
        "params": {},
        "rows": [],
        "failed": f"preparing failed: {error_text(error)}",
    }


def any_failed(results: Mapping[str, dict[str, Any]]) -> bool:
    return any(
        res.get("failed") or any(r.get("failed") for r in res["rows"]) for res in results.values()
    )


def _time(value: float | None, unit: str) -> str:
    if value is None:
        return "failed"
    if unit == "MiB":
        return f"{value:.0f} MiB"
    if unit == "n":
        # Counts per node (a node's share of one request) need their fraction.
        return f"{value:,.0f}" if value == int(value) or value >= 100 else f"{value:,.2f}"
    if unit == "ms":
        return f"{value:.1f} ms"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def _busiest(cores: dict[str, float]) -> str:
    top = sorted(cores.items(), key=lambda kv: -kv[1])[:2]
    return ", ".join(f"{k} {v:.2f}" for k, v in top if v >= 0.05)


COLUMNS = (
    ("row", "left"),
    ("median", "right"),
    ("min", "right"),
    ("max", "right"),
    ("n", "right"),
    ("MB/s", "right"),
    ("ratio", "right"),
    ("baseline", "left"),
    ("busiest (cores)", "left"),
    ("failed", "left"),
)


def _cells(r: dict[str, Any]) -> list[str]:
    unit = r["unit"]
    return [
        r["label"],
        _time(r["median"], unit),
        _time(r["min"], unit),
        _time(r["max"], unit),
        str(len(r["values"])),
        f"{r['mb_per_s']:.0f}" if r["mb_per_s"] else "",
        f"{r['ratio']:.2f}" if r["ratio"] is not None else "",
        r["baseline"] or "",
        _busiest(r["cpu_cores"]),
        r.get("failed") or "",
    ]


def render(results: Mapping[str, dict[str, Any]], console: Console) -> None:
    for name, result in results.items():
        if result.get("failed"):
            console.print(f"{name}: {result['summary']}: {result['failed']}")
            continue
        table = Table(
            title=f"{name}: {result['summary']}",
            title_justify="left",
            caption=", ".join(f"{k}={v}" for k, v in result["params"].items()),
            caption_justify="left",
        )
        for col, justify in COLUMNS:
            table.add_column(col, justify=justify)  # type: ignore[arg-type]
        for r in result["rows"]:
            table.add_row(*_cells(r))
        console.print(table)


def markdown(results: Mapping[str, dict[str, Any]]) -> str:
    """The same tables as Markdown, for the README."""
    out: list[str] = []
    for name, result in results.items():
        if result.get("failed"):
            out += [f"{name}: {result['summary']}: {result['failed']}", ""]
            continue
        out += [f"{name}: {result['summary']}", ""]
        out.append("| " + " | ".join(col for col, _ in COLUMNS) + " |")
        out.append("|" + "|".join("---:" if j == "right" else "---" for _, j in COLUMNS) + "|")
        out += ["| " + " | ".join(_cells(r)) + " |" for r in result["rows"]]
        out.append("")
    return "\n".join(out)
