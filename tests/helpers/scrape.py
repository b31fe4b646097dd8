"""Prometheus scrapes as a monitoring system takes them: /metrics over real HTTP (workers) or
through the app (the API), parsed with prometheus_client's own parser; and workers as real
`tierpoint worker` processes serving /metrics on 127.0.0.1, their JSON logs in a file."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.worker_process import REPO, settings_env
from tierpoint.config import Settings

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
# Sample names a family of each type exposes, by suffix.
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "gauge": ("",),
    "info": ("_info",),
}


def parse(text: str) -> Samples:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def names(text: str) -> set[str]:
    """Every sample name the exposition can carry, including families with no sample yet (a
    labelled counter nobody has incremented)."""
    out = set()
    for family in text_string_to_metric_families(text):
        out |= {family.name + suffix for suffix in SUFFIXES.get(family.type, ("",))}
        out |= {s.name for s in family.samples}
    return out


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def http_get(port: int, path: str = "/metrics") -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        body: bytes = r.read()
        return body.decode()


async def scrape(port: int) -> str:
    return await asyncio.to_thread(http_get, port)


async def wait_serving(
    proc: subprocess.Popen[bytes], port: int, log: Path, path: str = "/metrics"
) -> None:
    """Until the process answers on its port (a worker binds once its catalog check passed)."""
    while True:
        if proc.poll() is not None:
            output = await asyncio.to_thread(log.read_text, errors="replace")
            raise RuntimeError(f"process exited ({proc.returncode}):\n{output[-3000:]}")
        try:
            await asyncio.to_thread(http_get, port, path)
            return
        except OSError:
            await asyncio.sleep(0.2)


@contextlib.contextmanager
def tierpoint_process(
    settings: Settings, args: Sequence[str], log: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """`tierpoint ARGS` with `settings` and JSON logs to `log`. Stopped with SIGTERM (the way
    Kubernetes stops it), killed if it hangs."""
    env = settings_env(settings) | {"TIERPOINT_LOG_JSON": "true"}
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "apps.cli.main", *args],
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=60)


def worker_with_metrics(
    settings: Settings, args: Sequence[str], port: int, log: Path
) -> contextlib.AbstractContextManager[subprocess.Popen[bytes]]:
    """`tierpoint worker ARGS --metrics-port PORT --metrics-host 127.0.0.1`."""
    metrics = ["--metrics-port", str(port), "--metrics-host", "127.0.0.1"]
    return tierpoint_process(settings, ["worker", *args, *metrics], log)


def json_lines(log: Path) -> list[dict[str, Any]]:
    """The structured lines of a log (the console banner and anything else that is not a JSON
    object are skipped)."""
    lines = []
    for line in log.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            obj = json.loads(line)
            if isinstance(obj, dict):
                lines.append(obj)
    return lines
