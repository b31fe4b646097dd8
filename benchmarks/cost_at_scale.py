"""The orchestration cost of a large job, from per-checkpoint costs measured on the dev stack.

    python -m benchmarks.cost_at_scale --from results.json        # the orchestration scenario's
    python -m benchmarks.cost_at_scale --point 1,1,67,10,17,9,1 --point 100000,64,...

Each measured cost (Temporal history events, activity tasks, catalog rows, ...) is fitted as
`a + c·b + d·S` over the measured checkpoints (b = batches per stage, S = shards; least squares,
fewer terms when there are fewer distinct points), then evaluated for the target job and scaled
to an hour. Bytes per tier follow from the shard sizes and the copy path (every tier written
once; the local and the shared tier each read twice: a verification read-back and the next
copy's source; S3 verified by a HEAD). Rates a Temporal cluster or a Postgres sustains are
arguments, not measurements: docs/benchmarks.md says where the defaults come from.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from activities import batching
from tierpoint.config import Settings

# The per-checkpoint costs the orchestration scenario reports, in --point order after S and b.
METRICS = (
    "history_events",
    "activity_tasks",
    "retention_events",
    "catalog_rows",
    "catalog_events",
    "api_requests",
    "local_activities",
)
GB = 1e9
MiB = 1024 * 1024


@dataclass(frozen=True)
class Point:
    shards: int
    batches: int
    costs: dict[str, float]


def points_from_results(path: Path) -> list[Point]:
    """The medians of each shard count's rows in a `python -m benchmarks --out` file."""
    doc = json.loads(path.read_text())
    rows = doc["scenarios"]["orchestration"]["rows"]
    by_method: dict[str, dict[str, float]] = {}
    for r in rows:
        by_method.setdefault(r["method"], {})[r["metric"]] = float(r["median"])
    points = []
    for method, m in by_method.items():
        shards = int(method.split()[0].replace(",", ""))
        costs = {k: m.get(k, 0.0) for k in METRICS}
        points.append(Point(shards, int(m["batches"]), costs))
    return sorted(points, key=lambda p: p.shards)


def parse_point(text: str) -> Point:
    values = [float(v) for v in text.split(",")]
    if len(values) < 2 + len(METRICS) - 1:
        raise argparse.ArgumentTypeError(f"--point needs S,b,{','.join(METRICS)}")
    costs = dict(zip(METRICS, values[2:], strict=False))
    costs.setdefault("local_activities", 0.0)
    return Point(int(values[0]), int(values[1]), costs)


def _solve(a: list[list[float]], y: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting of a small square system."""
    n = len(y)
    m = [[*row, y[i]] for i, row in enumerate(a)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        m[col], m[pivot] = m[pivot], m[col]
        if abs(m[col][col]) < 1e-12:
            raise ValueError("the measured points do not separate batches from shards")
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [x - f * p for x, p in zip(m[r], m[col], strict=True)]
    return [m[i][n] / m[i][i] for i in range(n)]


def fit(points: Sequence[Point], metric: str) -> tuple[float, float, float]:
    """(a, c, d) of `a + c·b + d·S` by least squares (normal equations); the terms the points
    cannot tell apart are dropped (d first, then c)."""
    ys = [p.costs[metric] for p in points]
    distinct_b = len({p.batches for p in points})
    distinct = len({(p.batches, p.shards) for p in points})
    terms: list[str] = ["1"]
    if distinct_b >= 2:
        terms.append("b")
    if distinct >= 3:
        terms.append("S")

    def x(p: Point) -> list[float]:
        return [{"1": 1.0, "b": float(p.batches), "S": float(p.shards)}[t] for t in terms]

    xs = [x(p) for p in points]
    k = len(terms)
    ata = [[sum(r[i] * r[j] for r in xs) for j in range(k)] for i in range(k)]
    aty = [sum(r[i] * y for r, y in zip(xs, ys, strict=True)) for i in range(k)]
    try:
        sol = dict(zip(terms, _solve(ata, aty), strict=True))
    except ValueError:
        sol = {"1": sum(ys) / len(ys)}
    return sol.get("1", 0.0), sol.get("b", 0.0), sol.get("S", 0.0)


def default_batches(
    nodes: int,
    shards_per_node: int,
    batch_size: int,
    max_batches: int,
    *,
    shard_bytes: float = 0.0,
    parallelism: int = 4,
    min_batch_bytes: float = 64 * MiB,
) -> int:
    """Batches per stage by the lifecycle's own rule (activities/batching.py) for nodes that
    each hold `shards_per_node` shards of `shard_bytes`: batches never span nodes, so one node's
    batches times the nodes."""
    settings = Settings.model_construct(
        shard_batch_size=batch_size, max_batches_per_stage=max_batches
    )
    size = batching.batch_size(settings, nodes * shards_per_node)
    one_node = [("node", o, int(shard_bytes)) for o in range(shards_per_node)]
    return nodes * len(batching.plan_batches(one_node, size, parallelism, int(min_batch_bytes)))


def _n(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 10 else f"{v:,.2f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.cost_at_scale", description=__doc__)
    p.add_argument("--from", dest="results", type=Path, help="a `python -m benchmarks --out` file")
    p.add_argument("--point", action="append", type=parse_point, default=[], metavar="S,b,...")
    p.add_argument("--nodes", type=int, default=10_000)
    p.add_argument("--gpus", type=int, default=8, help="ranks per node, one shard each")
    p.add_argument("--shard-gb", type=float, default=2.0)
    p.add_argument("--interval-min", type=float, default=10.0, help="minutes between checkpoints")
    p.add_argument("--batches", type=int, default=None, help="batches per stage (default: rule)")
    p.add_argument("--batch-size", type=int, default=500, help="shard_batch_size")
    p.add_argument("--max-batches", type=int, default=64, help="max_batches_per_stage")
    p.add_argument("--tiers", type=int, default=3)
    p.add_argument("--part-mib", type=float, default=16.0, help="S3 multipart part size")
    p.add_argument(
        "--api-per-rank",
        type=float,
        default=0.0,
        help="requests per rank per save beyond the registration (TierpointWriter: none, its "
        "coordinator alone asks); the coordinator adds --api-extra",
    )
    p.add_argument(
        "--api-extra",
        type=float,
        default=2.0,
        help="the coordinator's step check and tier lookup",
    )
    p.add_argument(
        "--transitions-per-second",
        type=float,
        default=1000.0,
        help="history events one small Temporal cluster sustains (an assumption; see the doc)",
    )
    p.add_argument("--bytes-per-row", type=float, default=250.0, help="catalog row + indexes")
    p.add_argument(
        "--parallelism",
        type=int,
        default=4,
        help="tier.parallelism: batches in flight per node on the nodes' queues, and across the "
        "cluster on the shared queue",
    )
    p.add_argument("--min-batch-mib", type=float, default=64.0, help="min_batch_bytes in MiB")
    p.add_argument(
        "--node-gbs", type=float, default=2.0, help="GB/s one node seals (reads back) its shards"
    )
    p.add_argument(
        "--stream-gbs",
        type=float,
        default=0.5,
        help="GB/s one batch activity uploads shared -> S3 (one stream of the shared workers)",
    )
    args = p.parse_args(argv)

    points = list(args.point)
    if args.results is not None:
        points += points_from_results(args.results)
    if not points:
        p.error("give --from results.json or --point")
    shards = args.nodes * args.gpus
    b = args.batches or default_batches(
        args.nodes,
        args.gpus,
        args.batch_size,
        args.max_batches,
        shard_bytes=args.shard_gb * GB,
        parallelism=args.parallelism,
        min_batch_bytes=args.min_batch_mib * MiB,
    )
    per_hour = 60.0 / args.interval_min
    print(f"measured: {', '.join(f'S={q.shards:,} b={q.batches}' for q in points)}")
    print(
        f"target: {args.nodes:,} nodes x {args.gpus} = {shards:,} shards of {args.shard_gb} GB, "
        f"every {args.interval_min:g} min ({per_hour:g}/h), b = {b:,} batches per stage\n"
    )
    print(
        f"{'per checkpoint / per hour':<34}{'fit a + c*b + d*S':>34}{'checkpoint':>16}{'hour':>18}"
    )
    est: dict[str, float] = {}
    for metric in METRICS:
        a, c, d = fit(points, metric)
        est[metric] = max(0.0, a + c * b + d * shards)
        a, c, d = (0.0 if abs(v) < 5e-4 else v for v in (a, c, d))
        formula = f"{a:.1f} + {c:.2f}b + {d:.3f}S"
        print(f"{metric:<34}{formula:>34}{_n(est[metric]):>16}{_n(est[metric] * per_hour):>18}")
    api = est["api_requests"] + args.api_extra + args.api_per_rank * shards
    print(f"{'api_requests incl. every rank':<34}{'':>34}{_n(api):>16}{_n(api * per_hour):>18}")
    parts = math.ceil(args.shard_gb * GB / (args.part_mib * MiB))
    s3_req = shards * ((1 + parts + 1 + 1) if parts > 1 else 2)
    print(
        f"{'S3 requests':<34}{f'{parts} parts/shard':>34}"
        f"{_n(s3_req):>16}{_n(s3_req * per_hour):>18}"
    )

    ckpt = shards * args.shard_gb * GB
    secs = args.interval_min * 60
    print("\nbytes per tier (TB per checkpoint, per hour; GB/s to keep up within the interval)")
    for tier, written, read in (("local (all nodes)", 1, 2), ("shared", 1, 2), ("s3", 1, 0)):
        w, r = written * ckpt, read * ckpt
        print(
            f"  {tier:<18} written {w / 1e12:,.0f} TB, {w * per_hour / 1e12:,.0f} TB/h "
            f"({w / secs / GB:,.1f} GB/s); read {r / 1e12:,.0f} TB, "
            f"{r * per_hour / 1e12:,.0f} TB/h ({r / secs / GB:,.1f} GB/s)"
        )
    node = args.gpus * args.shard_gb * GB
    print(
        f"  per node: {node / GB:g} GB written, {2 * node / GB:g} GB read per checkpoint "
        f"({node / secs / 1e6:,.0f} + {2 * node / secs / 1e6:,.0f} MB/s averaged over the interval)"
    )

    events = (est["history_events"] + est["retention_events"]) * per_hour / 3600
    actions = (est["activity_tasks"] + est["local_activities"]) * per_hour / 3600
    rows = est["catalog_rows"] * per_hour / 3600
    print("\nsizing (averaged over the hour; a checkpoint's work bunches within its interval)")
    print(
        f"  Temporal: {events:,.1f} history events/s, {actions:,.1f} activities/s: "
        f"{events / args.transitions_per_second:.2f}x of a cluster sustaining "
        f"{args.transitions_per_second:,.0f} events/s"
    )
    print(
        f"  Postgres (catalog): {rows:,.0f} rows/s written, "
        f"{rows * 3600 * args.bytes_per_row / GB:,.1f} GB/h of table + index before retention"
    )
    print(f"  API: {api * per_hour / 3600:,.1f} requests/s")
    # Stages on the nodes' queues: every node at once (its own window, the stage's children at
    # once), so a node's bytes at its bandwidth. The shared queue's stage has one window of
    # `parallelism` for the cluster: that many streams must carry the checkpoint in the interval.
    node_stage = node / (args.node_gbs * GB)
    print(
        f"  a stage on the nodes' queues (seal, copy off the local tier): {node / GB:g} GB per "
        f"node at {args.node_gbs:g} GB/s = {node_stage:.0f} s, every node at once"
    )
    need = ckpt / secs / (args.stream_gbs * GB)
    s3_stage = ckpt / (min(args.parallelism, b) * args.stream_gbs * GB)
    print(
        f"  the shared -> S3 stage: parallelism {args.parallelism} x {args.stream_gbs:g} GB/s "
        f"takes {s3_stage / 60:,.0f} min ({s3_stage / secs:,.1f}x the interval); keeping up "
        f"needs parallelism >= {math.ceil(need):,} on the S3 tier (and shared workers to run them)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
