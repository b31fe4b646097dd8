"""Curves of the scale scenario's rows, for docs/scale.md: cost per node, time to restorable and
CPU per node against the number of nodes, drawn from a results file of
`python -m benchmarks --only scale ... --out RESULTS.json`.

matplotlib is the optional `bench` dependency group:

    uv run --frozen --extra dev --group bench python -m benchmarks.scale_plots RESULTS.json

writes `scale-*.png` into docs/images/ (or `--out DIR`). Only what the run measured is drawn.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.scenarios.scale import COUNTS, TIERS

OUT = Path("docs") / "images"
# Counts per node worth a curve: a flat one is a cost that grows no faster than the nodes.
PER_NODE = ("history_events", "activity_tasks", "workflow_tasks", "catalog_rows", "api_requests")


def series(doc: dict[str, Any], metric: str) -> list[float]:
    """The median of `metric` at each node count of the run, in the run's order."""
    scale = doc["scenarios"]["scale"]
    by_method = {r["method"]: r["median"] for r in scale["rows"] if r["metric"] == metric}
    return [by_method[f"{n:,} nodes"] for n in scale["params"]["nodes"]]


def _load_note(doc: dict[str, Any]) -> str:
    machine = doc.get("machine", {})
    start = machine.get("load_average") or machine.get("load_average_start")
    end = machine.get("load_average_end")
    parts = [f"{machine.get('cpus', '?')} cores"]
    if start:
        parts.append(f"load {start[0]:.1f} at start")
    if end:
        parts.append(f"{end[0]:.1f} at end")
    return ", ".join(parts)


def _figure(
    nodes: Sequence[int],
    lines: dict[str, list[float]],
    title: str,
    ylabel: str,
    note: str,
    path: Path,
    *,
    log_y: bool = False,
) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    for label, ys in lines.items():
        ax.plot(nodes, ys, marker="o", label=label)
    ax.set_xscale("log")
    if log_y:
        ax.set_yscale("log")
    ax.set_xticks(list(nodes), [f"{n:,}" for n in nodes])
    ax.set_xlabel("simulated nodes (one checkpoint of 8 x 16 KiB shards per node)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
    fig.text(0.99, 0.01, note, ha="right", va="bottom", fontsize="x-small", color="gray")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def draw(doc: dict[str, Any], out: Path) -> list[Path]:
    scale = doc["scenarios"]["scale"]
    nodes: list[int] = list(scale["params"]["nodes"])
    note = f"measured: {_load_note(doc)}"
    out.mkdir(parents=True, exist_ok=True)
    made = []
    path = out / "scale-per-node.png"
    lines = {COUNTS[m]: series(doc, f"{m}/node") for m in PER_NODE}
    _figure(
        nodes, lines, "Cost per node of one checkpoint", "count per node", note, path, log_y=True
    )
    made.append(path)
    path = out / "scale-restorable.png"
    lines = {f"restorable on {t}": series(doc, f"restorable {t}") for t in TIERS}
    _figure(nodes, lines, "Registration to restorable", "seconds", note, path)
    made.append(path)
    path = out / "scale-cpu-per-node.png"
    cpu = sorted(
        {r["metric"] for r in scale["rows"] if r["metric"].startswith("cpu ")}
        - {m for m in (r["metric"] for r in scale["rows"]) if m.endswith("/node")}
    )
    lines = {m[len("cpu ") :]: series(doc, f"{m}/node") for m in cpu}
    _figure(nodes, lines, "CPU seconds per node, by process", "CPU s per node", note, path)
    made.append(path)
    return made


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("results", type=Path, help="a results file of the scale scenario (--out)")
    p.add_argument("--out", type=Path, default=OUT, help="where the PNGs go (docs/images)")
    args = p.parse_args(argv)
    doc = json.loads(args.results.read_text())
    for path in draw(doc, args.out):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
