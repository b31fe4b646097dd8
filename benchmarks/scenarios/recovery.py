"""Recovery: a lost node's files restored on another node, in the same run, from a peer (the
node's data endpoint, as a peer tier's holder serves its copies), from the shared tier and from
S3, each with the client's restore (`restore_plan`: every shard read once, checked against its
registered crc32c, fsynced and renamed into place), against `cp -r` + `sync` of the files where
the endpoint reads them.

The checkpoint (the end_to_end size) is written on one node of the dev stack and waited for until
it is restorable on S3. The data endpoint is the node worker's own server
(`tierpoint/services/data_endpoint.py`), run here against the stack's catalog and serving that
node's local tier: the bytes, the server and the client's reader are a peer copy's; only the
file's directory differs. Page caches of the sources and the destination are dropped before each
run. Rows: the peer restore against the raw copy, the shared tier's and S3's against the peer's
(a ratio above 1: the peer was that much faster). On this machine every "network" is loopback
and the shared tier a local disk: the ratios say what the software costs, not what a cluster's
links would give (see docs/benchmarks.md for that arithmetic).
"""

from __future__ import annotations

import json
import shutil
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tierpoint_client.models import PlanEntry
from tierpoint_client.restore import restore_plan

from benchmarks.env import Env
from benchmarks.harness import Method, Outcome, Row, Scenario, Watched
from benchmarks.scenarios.copy_posix import drop_cache
from benchmarks.scenarios.orchestration import stack_env
from benchmarks.scenarios.stack_ckpt import MiB, Stack, cp_sync
from tierpoint.catalog.engine import make_sync_engine, sync_sessions
from tierpoint.config import Settings
from tierpoint.services.data_endpoint import DataServer, serve
from tierpoint.storage.base import ShardRef
from tierpoint.storage.peer_http import shard_url

RAW = "cp -r + sync of the node's files"
PEER = "restore from a peer's data endpoint"
STEP = 1
SECRET = "bench-worker-credential"


class Recovery(Scenario):
    name = "recovery"
    summary = "a lost node's files restored from a peer vs the shared tier vs S3, same run"

    def __init__(self, env: Env, mib: int, shards: int) -> None:
        self.env, self.shards = env, shards
        self.size = mib * MiB // shards
        self.nbytes = self.size * shards
        self.work = env.work / self.name
        self.job = f"recovery-{uuid.uuid4().hex[:6]}"
        self.stack: Stack | None = None
        self.server: DataServer | None = None
        self.node = ""
        self.plans: dict[str, list[PlanEntry]] = {}

    def params(self) -> dict[str, Any]:
        return {"bytes": self.nbytes, "shards": self.shards, "client workers": 4}

    def watched(self) -> Watched:
        # The endpoint's threads and the restores run in this process: "bench".
        return self.stack.watched() if self.stack is not None else {}

    def prepare(self) -> list[Method]:
        self.stack = stack = Stack(self.env)
        self.node = node = stack.restorable_everywhere(self.job, STEP, self.shards, self.size)
        self.server = self._serve(node)
        for tier in ("lustre", "s3"):
            latest = stack.client.latest(self.job, tier=tier)
            assert latest is not None and latest.step == STEP, tier
            self.plans[tier] = list(latest.plan)
        self.plans["peer"] = [self._via_endpoint(e) for e in self.plans["lustre"]]
        self.work.mkdir(parents=True)
        n = self.nbytes
        return [
            self._method(RAW, self._raw, Row(RAW, nbytes=n)),
            self._method(PEER, lambda: self._restore("peer"), Row(PEER, baseline=RAW, nbytes=n)),
            self._method(
                "restore from the shared tier",
                lambda: self._restore("lustre"),
                Row("restore from the shared tier", baseline=PEER, nbytes=n),
            ),
            self._method(
                "restore from S3",
                lambda: self._restore("s3"),
                Row("restore from S3", baseline=PEER, nbytes=n),
            ),
        ]

    def _serve(self, node: str) -> DataServer:
        assert self.stack is not None
        env = stack_env(self.stack.process.data_dir)
        settings = Settings(
            database_url=env["TIERPOINT_DATABASE_URL"],
            tiers=json.loads(env["TIERPOINT_TIERS"]),
            data_token=SECRET,
        )
        self._engine = make_sync_engine(settings.database_url, pool_size=4)
        return serve(settings, sync_sessions(self._engine), node, 0)

    def _via_endpoint(self, shared: PlanEntry) -> PlanEntry:
        """The same shard, read over the node's data endpoint from its local tier."""
        assert self.server is not None
        url = shard_url(self.server.url, "ssd", ShardRef(self.job, STEP, shared.path))
        return PlanEntry(
            shared.path, shared.size, shared.crc32c, "ssd", "peer", self.node, url, url=url
        )

    def _method(self, name: str, run: Callable[[], Outcome], row: Row) -> Method:
        return Method(name, run, (row,), before=self._drop, after=self._clear)

    @property
    def dest(self) -> Path:
        return self.work / "dest"

    def _sources(self) -> Sequence[Path]:
        assert self.stack is not None
        return (self.stack.shared / self.job, self.stack.local_dir(self.node, self.job, STEP))

    def _drop(self) -> None:
        for root in self._sources():
            drop_cache(root)

    def _clear(self) -> None:
        drop_cache(self.dest)
        shutil.rmtree(self.dest, ignore_errors=True)

    def _raw(self) -> Outcome:
        assert self.stack is not None
        t0 = time.perf_counter()
        cp_sync(self.stack.local_dir(self.node, self.job, STEP), self.dest)
        return Outcome({"seconds": time.perf_counter() - t0})

    def _restore(self, source: str) -> Outcome:
        assert self.stack is not None
        tiers = {t.name: t for t in self.stack.client.tiers()}
        t0 = time.perf_counter()
        files, _ = restore_plan(self.plans[source], self.dest, tiers, workers=4, token=SECRET)
        seconds = time.perf_counter() - t0
        if sum(f.size for f in files) != self.nbytes:
            raise RuntimeError(f"restore from {source} wrote {sum(f.size for f in files)} B")
        return Outcome({"seconds": seconds})

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self._engine.dispose()
        if self.stack is not None:
            self.stack.forget(self.job)
        shutil.rmtree(self.work, ignore_errors=True)
