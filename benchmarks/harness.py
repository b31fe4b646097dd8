"""What every scenario shares: methods run interleaved and rotated with their baselines, the
median/min/max of each reported timing, ratios to a baseline measured in the same run, the CPU
each watched process spent (which one was saturated), a rich table and a JSON document.

A scenario prepares its data once and returns its methods. A method is one way of doing the
work; one run of it yields named timings (`Outcome.metrics`, seconds). A `Row` is one timing of one
method as the table shows it, optionally compared to another row (its baseline): ratio =
median / baseline median, so below 1 is faster than the baseline.
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
    outcome: Outcome
    wall: float  # the run's own span, for CPU seconds -> cores
    cpu: dict[str, float]


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
            runs.append(Run(m.name, outcome, wall, cpu))
            if m.after is not None:
                m.after()
            done()
    return runs


def _cores(runs: list[Run]) -> dict[str, float]:
    """Median cores each process kept busy over the method's runs (CPU seconds / wall)."""
    labels = {k for r in runs for k in r.cpu}
    return {
        k: round(statistics.median(r.cpu.get(k, 0.0) / max(r.wall, 1e-9) for r in runs), 3)
        for k in sorted(labels)
    }


def summarize(scenario: Scenario, methods: list[Method], runs: list[Run]) -> dict[str, Any]:
    by_method = {m.name: [r for r in runs if r.method == m.name] for m in methods}
    rows: list[dict[str, Any]] = []
    for m in methods:
        mine = by_method[m.name]
        cores = _cores(mine)
        rss = [r.outcome.rss_mib for r in mine if r.outcome.rss_mib is not None]
        for row in m.rows:
            values = [r.outcome.metrics[row.metric] for r in mine]
            median = statistics.median(values)
            rows.append(
                {
                    "label": row.label,
                    "method": m.name,
                    "metric": row.metric,
                    "unit": row.unit,
                    "baseline": row.baseline,
                    "values": values,
                    "median": median,
                    "min": min(values),
                    "max": max(values),
                    "mb_per_s": row.nbytes / median / 1e6 if row.nbytes and median > 0 else None,
                    "cpu_cores": cores,
                    "peak_rss_mib": max(rss) if rss else None,
                }
            )
    medians = {r["label"]: r["median"] for r in rows}
    for r in rows:
        base = r["baseline"]
        if base is not None:
            if base not in medians:
                raise ValueError(f"{scenario.name}: row {r['label']!r} names no row {base!r}")
            r["ratio"] = r["median"] / medians[base] if medians[base] > 0 else None
        else:
            r["ratio"] = None
    return {"summary": scenario.summary, "params": scenario.params(), "rows": rows}


def _time(value: float, unit: str) -> str:
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


def render(results: Mapping[str, dict[str, Any]], console: Console) -> None:
    for name, result in results.items():
        table = Table(
            title=f"{name}: {result['summary']}",
            title_justify="left",
            caption=", ".join(f"{k}={v}" for k, v in result["params"].items()),
            caption_justify="left",
        )
        for col, justify in (
            ("row", "left"),
            ("median", "right"),
            ("min", "right"),
            ("max", "right"),
            ("n", "right"),
            ("MB/s", "right"),
            ("ratio", "right"),
            ("baseline", "left"),
            ("busiest (cores)", "left"),
        ):
            table.add_column(col, justify=justify)  # type: ignore[arg-type]
        for r in result["rows"]:
            unit = r["unit"]
            table.add_row(
                r["label"],
                _time(r["median"], unit),
                _time(r["min"], unit),
                _time(r["max"], unit),
                str(len(r["values"])),
                f"{r['mb_per_s']:.0f}" if r["mb_per_s"] else "",
                f"{r['ratio']:.2f}" if r["ratio"] is not None else "",
                r["baseline"] or "",
                _busiest(r["cpu_cores"]),
            )
        console.print(table)


def markdown(results: Mapping[str, dict[str, Any]]) -> str:
    """The same tables as Markdown, for the README."""
    out: list[str] = []
    for name, result in results.items():
        out += [f"{name}: {result['summary']}", ""]
        out += [
            "| row | median | min | max | n | MB/s | ratio | baseline | busiest (cores) |",
            "|---|---:|---:|---:|---:|---:|---:|---|---|",
        ]
        for r in result["rows"]:
            unit = r["unit"]
            cells = [
                r["label"],
                _time(r["median"], unit),
                _time(r["min"], unit),
                _time(r["max"], unit),
                str(len(r["values"])),
                f"{r['mb_per_s']:.0f}" if r["mb_per_s"] else "",
                f"{r['ratio']:.2f}" if r["ratio"] is not None else "",
                r["baseline"] or "",
                _busiest(r["cpu_cores"]),
            ]
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)
