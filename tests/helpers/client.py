"""Helpers of the training-side client tests: the running stack they talk to, shard trees
written and read back, and a plain file server standing in for holders' data endpoints."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from temporalio.client import Client as TemporalClient
from tierpoint_client import Checkpoint, Client

from tests.helpers.stuck import lifecycle_report
from tierpoint.config import Settings


@dataclass(frozen=True)
class Stack:
    settings: Settings
    api_url: str
    client: Client
    nodes: tuple[str, ...]
    # The admin token `client` sends, for processes that talk to the API.
    token: str
    # The API's own /metrics listener (tests.helpers.scrape reads it).
    metrics_port: int
    # True while the API runs no request: it counts one in its metrics only once the request's
    # background work (e.g. a retention request after a lease's release) is done too.
    api_idle: Callable[[], bool]
    # The stack's own connection to Temporal: what a wait that ran out says about the lifecycle.
    temporal: TemporalClient

    async def wait_restorable(
        self,
        job: str,
        step: int,
        tier: str,
        seconds: float = 300.0,
    ) -> Checkpoint:
        """The client's wait on the checkpoint (of the job's current branch); when it runs out,
        the TimeoutError says what its lifecycle is doing."""
        try:
            return await asyncio.to_thread(
                self.client.wait_restorable, job, step, tier, seconds, 0.2
            )
        except TimeoutError as e:
            cp = await asyncio.to_thread(self.client.checkpoint, job, step)
            report = await lifecycle_report(self.temporal, job, step, cp.branch)
            raise TimeoutError(f"{e}: {report}") from e

    def local_dir(self, node: str, job: str, step: int) -> Path:
        return self.settings.tier("ssd").root_for(node) / job / str(step)

    def shared_dir(self, job: str, step: int) -> Path:
        return self.settings.tier("lustre").root_for(None) / job / str(step)


def write_shards(directory: Path, sizes: dict[str, int]) -> dict[str, bytes]:
    """Random shards under directory; returns {relative path: bytes}."""
    written = {}
    for rel, size in sizes.items():
        path = directory / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        data = os.urandom(size)
        path.write_bytes(data)
        written[rel] = data
    return written


def read_tree(root: Path) -> dict[str, bytes]:
    """Every file under root (temporary files included, so leftovers show up)."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


class QuietFiles(SimpleHTTPRequestHandler):
    """Serves its directory as a data endpoint serves files, without a log line per request."""

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextlib.contextmanager
def file_server(root: Path, handler: type[QuietFiles] = QuietFiles) -> Iterator[str]:
    """An HTTP server of `root` on a free port of 127.0.0.1 until the block ends: its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
