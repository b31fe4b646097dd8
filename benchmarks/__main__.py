"""Run tierpoint's benchmarks: every scenario against its baselines, interleaved, on services this
run starts itself (a moto S3 server, the embedded dev stack, temp dirs), then a table and JSON.

    .venv/bin/python -m benchmarks                    # full sizes (about 1 GiB per scenario)
    .venv/bin/python -m benchmarks --quick            # tiny sizes, 2 repeats: a smoke run
    .venv/bin/python -m benchmarks --only dcp --mib 256 --repeats 3 --out results.json
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from benchmarks.env import Env
from benchmarks.harness import (
    Method,
    any_failed,
    failed_scenario,
    markdown,
    render,
    run_methods,
    summarize,
)
from benchmarks.scenarios import SCENARIOS, Sizes


def selected(methods: list[Method], wanted: list[str] | None) -> list[Method]:
    """The methods named by `wanted` and those their rows' baselines belong to, in their order."""
    if not wanted:
        return methods
    owner = {row.label: m.name for m in methods for row in m.rows}
    keep = {m.name for m in methods if any(w in m.name for w in wanted)}
    while True:
        more = {
            owner[row.baseline]
            for m in methods
            if m.name in keep
            for row in m.rows
            if row.baseline in owner
        }
        if more <= keep:
            break
        keep |= more
    if not keep:
        raise SystemExit(f"no method's name contains any of {wanted}")
    return [m for m in methods if m.name in keep]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks", description=(__doc__ or "").split("\n\n")[0]
    )
    p.add_argument("--quick", action="store_true", help="tiny sizes and 2 repeats (CI smoke)")
    p.add_argument(
        "--only",
        action="append",
        choices=list(SCENARIOS),
        metavar="NAME",
        help=f"run only this scenario (repeatable): {', '.join(SCENARIOS)}",
    )
    p.add_argument("--repeats", type=int, default=None, help="runs per method (default 3; quick 2)")
    p.add_argument("--mib", type=int, default=None, help="data per run of the data scenarios")
    p.add_argument(
        "--max-shards",
        type=int,
        default=None,
        help="orchestration: only checkpoints of at most this many shards (100,000 through the "
        "single-threaded moto take tens of minutes)",
    )
    p.add_argument(
        "--nodes",
        type=int,
        action="append",
        default=None,
        help="scale: simulated nodes per run (repeatable; default 10, 100 and 1,000; quick 10)",
    )
    p.add_argument(
        "--leases",
        type=int,
        default=None,
        help="leases: requests per run of each method (default 10,000; quick 200)",
    )
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    p.add_argument("--markdown", action="store_true", help="also print the tables as Markdown")
    p.add_argument("--dir", type=Path, default=None, help="parent of the work dir (default: tmp)")
    p.add_argument("--keep", action="store_true", help="keep the work dir (logs, data)")
    p.add_argument(
        "--method",
        action="append",
        default=None,
        metavar="TEXT",
        help="run only the methods whose name contains TEXT (repeatable), and the methods their "
        "rows are compared to",
    )
    return p.parse_args(argv)


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        # Not platform.platform(): it may run `uname -p` in a subprocess on first use.
        "platform": f"{platform.system()}-{platform.release()}-{platform.machine()}",
        "python": platform.python_version(),
        "load_average": os.getloadavg(),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console(stderr=True)
    sizes = Sizes.quick(args.mib) if args.quick else Sizes.full(args.mib)
    if args.max_shards is not None:
        sizes = dataclasses.replace(
            sizes, orchestration=tuple(n for n in sizes.orchestration if n <= args.max_shards)
        )
    if args.nodes:
        sizes = dataclasses.replace(sizes, scale=tuple(args.nodes))
    if args.leases:
        sizes = dataclasses.replace(sizes, leases=args.leases)
    repeats = args.repeats or (2 if args.quick else 3)
    names = args.only or list(SCENARIOS)
    work = Path(tempfile.mkdtemp(prefix="tierpoint-bench-", dir=args.dir))
    os.chmod(work, 0o755)  # the embedded Postgres runs as its own user when we are root
    env = Env(work, args.quick, keep=args.keep)
    started = datetime.datetime.now(datetime.UTC)
    doc: dict[str, Any] = {
        "date": started.isoformat(timespec="seconds"),
        "command": " ".join(
            ["python -m benchmarks", *(argv if argv is not None else sys.argv[1:])]
        ),
        "machine": machine(),
        "repeats": repeats,
        "scenarios": {},
    }
    t0 = time.monotonic()
    try:
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
        ) as progress:
            for name in names:
                scenario = SCENARIOS[name](env, sizes)
                task = progress.add_task(f"{name}: preparing", total=None)
                try:
                    try:
                        prepared = scenario.prepare()
                    except Exception as exc:  # reported with the others' results
                        console.print_exception()
                        doc["scenarios"][name] = failed_scenario(scenario, exc)
                        progress.update(task, description=f"{name}: failed")
                        continue
                    methods = selected(prepared, args.method)
                    progress.update(task, total=repeats * len(methods), completed=0)

                    def step(method: str, name: str = name, task: Any = task) -> None:
                        progress.update(task, description=f"{name}: {method}")
                        if not console.is_terminal:  # a CI log: no live bar, one line per run
                            console.log(f"{name}: {method}")

                    def advance(task: Any = task) -> None:
                        progress.advance(task)

                    runs = run_methods(methods, repeats, scenario.watched, step, advance)
                    progress.update(task, description=f"{name}: done")
                    doc["scenarios"][name] = summarize(scenario, methods, runs)
                finally:
                    scenario.close()
    finally:
        env.close()
        if args.keep:
            console.print(f"work dir kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    doc["seconds"] = round(time.monotonic() - t0, 1)
    doc["machine"]["load_average_end"] = os.getloadavg()
    out = Console()
    if not out.is_terminal:
        out = Console(width=180)  # a log or a pipe: keep each row on one line
    render(doc["scenarios"], out)
    if args.markdown:
        print(markdown(doc["scenarios"]))
    if args.out is not None:
        args.out.write_text(json.dumps(doc, indent=2) + "\n")
        console.print(f"results written to {args.out}")
    # Every result is reported; a failure still makes the run's status say so.
    return 1 if any_failed(doc["scenarios"]) else 0


if __name__ == "__main__":
    sys.exit(main())
