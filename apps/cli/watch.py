"""`tierpoint watch [JOB]`: copies in flight as live progress bars (on a terminal; elsewhere one
line per change, for logs and pipes), refreshed every INTERVAL seconds until Ctrl-C or, with
`--until-idle`, until nothing is in flight. A copy that leaves flight is printed with the state
its tier ended in."""

from __future__ import annotations

import time
from typing import Annotated, Any
from urllib.parse import urlencode

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TaskID, TextColumn

from apps.cli.context import ApiUrlOpt, DataDirOpt, console
from apps.cli.ops_render import ago, percent, rate
from apps.cli.policy import Api
from apps.cli.show import checkpoint_path
from apps.devstack.facts import DEFAULT_DATA_DIR

Key = tuple[str, int, str]


class Watcher:
    def __init__(self, api: Api, job: str | None, tier: str | None) -> None:
        self._api = api
        params = {k: v for k, v in (("job", job), ("tier", tier)) if v is not None}
        self._path = "/v1/copies/in-flight?" + urlencode({**params, "limit": 1000})

    def poll(self) -> dict[Key, dict[str, Any]]:
        items = self._api.call("GET", self._path)["items"]
        return {(c["job"], c["step"], c["tier"]): c for c in items}

    def ended(self, key: Key) -> str:
        """How the copy that left flight ended: its tier's state now."""
        job, step, tier = key
        cp = self._api.call("GET", checkpoint_path(job, step) + "?shards=false")
        for t in cp["tiers"]:
            if t["tier"] == tier:
                return f"{t['state']}" + (f": {t['reason']}" if t.get("reason") else "")
        return "gone"


def _name(key: Key) -> str:
    return f"{key[0]} step {key[1]} -> {key[2]}"


def _line(key: Key, c: dict[str, Any]) -> str:
    eta = f" eta {ago(c['eta_seconds'])}" if c["eta_seconds"] is not None else ""
    return (
        f"{_name(key)}  {percent(c['bytes_done'], c['bytes_total'])}% "
        f"({c['bytes_done']}/{c['bytes_total']} bytes, shards "
        f"{c['shards_verified']}/{c['shards_total']}) {rate(c['bytes_per_second'])}{eta}"
    )


def _lines(w: Watcher, interval: float, until_idle: bool) -> None:
    shown: dict[Key, str] = {}
    while True:
        now = w.poll()
        for key in sorted(shown.keys() - now.keys()):
            console.print(f"{_name(key)}  done: {w.ended(key)}", highlight=False)
            del shown[key]
        for key, c in sorted(now.items()):
            line = _line(key, c)
            if shown.get(key) != line:
                console.print(line, highlight=False)
                shown[key] = line
        if until_idle and not now:
            console.print("idle: nothing in flight")
            return
        time.sleep(interval)


def _bars(w: Watcher, interval: float, until_idle: bool) -> None:
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        DownloadColumn(),
        TextColumn("{task.fields[shards]} shards  {task.fields[rate]}  eta {task.fields[eta]}"),
    )
    tasks: dict[Key, TaskID] = {}
    with Progress(*columns, console=console, refresh_per_second=4) as progress:
        while True:
            now = w.poll()
            for key in sorted(tasks.keys() - now.keys()):
                progress.remove_task(tasks.pop(key))
                progress.console.print(f"{_name(key)}  done: {w.ended(key)}")
            for key, c in sorted(now.items()):
                shards = f"{c['shards_verified']}/{c['shards_total']}"
                speed, eta = rate(c["bytes_per_second"]), ago(c["eta_seconds"])
                if key not in tasks:
                    tasks[key] = progress.add_task(
                        _name(key), total=c["bytes_total"], shards=shards, rate=speed, eta=eta
                    )
                progress.update(
                    tasks[key],
                    completed=c["bytes_done"],
                    total=c["bytes_total"],
                    shards=shards,
                    rate=speed,
                    eta=eta,
                )
            if until_idle and not now:
                break
            time.sleep(interval)
    console.print("idle: nothing in flight")


def watch(
    job: Annotated[str | None, typer.Argument(help="Only this job's copies.")] = None,
    tier: Annotated[str | None, typer.Option(help="Only copies to this tier.")] = None,
    until_idle: Annotated[
        bool, typer.Option("--until-idle", help="Stop once nothing is in flight.")
    ] = False,
    interval: Annotated[float, typer.Option(min=0.2, help="Seconds between refreshes.")] = 1.0,
    api_url: ApiUrlOpt = None,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR,
) -> None:
    """Copies in flight, live: progress, shards, rate and ETA, until Ctrl-C (or --until-idle)."""
    w = Watcher(Api(api_url, data_dir), job, tier)
    try:
        (_bars if console.is_terminal else _lines)(w, interval, until_idle)
    except KeyboardInterrupt:
        raise typer.Exit(0) from None
