"""The worker processes of the nodes that write no shards of their own and hold the writers' peer
copies, one process each, so that a rule can kill one with SIGKILL (its data endpoint dies with
it, mid-restore) and start it again (the node comes back: down is not lost)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path

from sqlalchemy import select

from tests.helpers.worker_process import WorkerProcess
from tierpoint.catalog.engine import make_sync_engine
from tierpoint.catalog.models import Node
from tierpoint.config import Settings

# Guards against a hang, not a performance assertion.
START_TIMEOUT = 120.0


class Holders:
    def __init__(self, settings: Settings, nodes: Iterable[str], logs: Path) -> None:
        self.settings = settings
        self.logs = logs
        self.engine = make_sync_engine(settings.database_url, pool_size=1)
        self.procs = {n: self._start(n) for n in nodes}
        # How often each holder was killed (reported at the end of the run).
        self.kills = 0

    def _start(self, node: str) -> WorkerProcess:
        return WorkerProcess(self.settings, node, self.logs / f"{node}.log")

    def alive(self) -> bool:
        return all(p.alive() for p in self.procs.values())

    def output(self) -> str:
        return "\n".join(p.output() for p in self.procs.values())

    def kill(self, node: str) -> None:
        """SIGKILL: the node's worker and its data endpoint are gone at once."""
        assert self.procs[node].kill() == -9, self.procs[node].output()
        self.kills += 1

    def restart(self, node: str) -> None:
        """The node's worker started again; returns once it has reported in with its new data
        endpoint (peers and restores find it through the catalog)."""
        before = self._seen(node)[0]
        self.procs[node] = self._start(node)
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            seen, url = self._seen(node)
            if url is not None and seen is not None and (before is None or seen > before):
                return
            assert self.procs[node].alive(), self.procs[node].output()
            assert time.monotonic() < deadline, f"{node} never reported in again"
            time.sleep(0.2)

    def _seen(self, node: str) -> tuple[datetime | None, str | None]:
        with self.engine.connect() as conn:
            row = conn.execute(
                select(Node.last_seen_at, Node.data_url).where(Node.id == node)
            ).one()
        return row.last_seen_at, row.data_url

    def close(self) -> None:
        for p in self.procs.values():
            p.kill()
        self.engine.dispose()
