"""A stack for many simulated nodes: a fleet of node workers (`tierpoint worker --no-shared
--node A --node B ...`), each process serving up to NODES_PER_PROCESS nodes' task queues, started
and stopped per size so that a size is measured with exactly its own pollers, in front of either

- services of its own, every part a real process (`start`): an embedded Postgres with the
  migrations, a Temporal dev server, a moto (the S3 tier), `tierpoint api` (its metrics on a
  listener of their own) and one shared `tierpoint worker`; or
- the benchmark's dev stack (`attach`, the CI smoke's shape): its API and shared worker are one
  process there, and starting it costs nothing the other scenarios have not paid already."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import boto3
from sqlalchemy import func, select, text
from sqlalchemy.orm import Session
from tierpoint_client import Client

from api.app import CATALOG_CONNECTIONS
from apps.devstack.services import (
    EmbeddedPostgres,
    MotoS3Server,
    TemporalDevServer,
    free_port,
)
from apps.worker import WORKER_CONNECTIONS
from benchmarks import pg_statements
from benchmarks.env import DevStackProcess, subprocess_env, tierpoint_env
from tierpoint.catalog import migrate
from tierpoint.catalog.engine import make_sync_engine
from tierpoint.catalog.models import Node
from tierpoint.catalog.token import tokens

# Node queues one worker process serves: 4 processes for 1,000 nodes on this 2-core machine.
NODES_PER_PROCESS = 250
START_TIMEOUT = 300.0
# A node's queue has one poller and a few tasks per checkpoint: the server's default of 4
# partitions per task queue only multiplies its task-queue state (at 1,000 nodes the dev
# server's SQLite timed out persisting it and the run failed).
ONE_PARTITION = (
    "matching.numTaskqueueReadPartitions=1",
    "matching.numTaskqueueWritePartitions=1",
)
JOB_PREFIX = "scale-"
# The benchmark's own engine, an admin connection and psql-style inspection beside the fleet.
OWN_CONNECTIONS = 10


def catalog_connections(nodes: int) -> int:
    """Postgres connections a fleet of `nodes` may hold at once: every process' pool full (the
    API's, the shared worker's, each node worker process'; all keep what they opened) and the
    benchmark's own. A Postgres whose `max_connections` is below it refuses the pool that grows
    last (at 1,000 nodes: the API's, mid-storm, 'too many clients', answered 503); a deployment
    of that size puts a pooler in front (docs/deployment.md, "A connection pooler")."""
    node_processes = -(-nodes // NODES_PER_PROCESS)
    return CATALOG_CONNECTIONS + WORKER_CONNECTIONS * (1 + node_processes) + OWN_CONNECTIONS


class Fleet:
    """`keep`: leave the work dir (every process's log, Temporal's database, the catalog's data)
    when it closes, as `--keep` asks."""

    def __init__(self, work: Path, keep: bool = False) -> None:
        self.work = work
        self.keep = keep
        self.pg: EmbeddedPostgres | None = None
        self.temporal: TemporalDevServer | None = None
        self.moto = MotoS3Server()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.node_procs: dict[str, subprocess.Popen[bytes]] = {}
        self.bucket = f"tp-scale-{uuid.uuid4().hex[:8]}"
        self.stack: DevStackProcess | None = None
        self.api_label = "api"
        self.tierpoint = str(Path(sys.executable).with_name("tierpoint"))

    def attach(self, stack: DevStackProcess) -> None:
        """Node workers against the dev stack's catalog, Temporal and tiers."""
        from benchmarks.scenarios.orchestration import stack_env

        info = stack.info
        assert info is not None and info.token is not None and info.metrics_url is not None
        self.stack = stack
        self.work.mkdir(parents=True)
        variables = stack_env(stack.data_dir)
        self.env = subprocess_env({**variables, "TIERPOINT_LOG_LEVEL": "WARNING"})
        self.database_url = variables["TIERPOINT_DATABASE_URL"]
        self.temporal_address = variables["TIERPOINT_TEMPORAL_ADDRESS"]
        self.engine = make_sync_engine(self.database_url, pool_size=2)
        self.local_root = next(t["root"] for t in info.tiers if t["kind"] == "local")
        self.api_url, self.token, self.metrics_url = info.api_url, info.token, info.metrics_url
        self.client = self.new_client()

    def start(
        self, peer_token: str | None = None, code: str | None = None, *, max_nodes: int = 100
    ) -> None:
        """Services of its own, every one a process, Postgres sized for up to `max_nodes`
        nodes; with `peer_token`, a peer tier after the local one, its workers' data endpoints
        taking that credential; with `code` too, a coded peer tier (`coded`, stripes of that
        code) after it."""
        self.work.mkdir(parents=True)
        os.chmod(self.work, 0o755)  # the embedded Postgres runs as its own user when we are root
        self.pg = EmbeddedPostgres(self.work / "pg")
        self.database_url = self.pg.start()
        # Settings read only at the server's start: set, then one restart.
        admin = make_sync_engine(self.database_url, pool_size=1)
        with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
            slots = max(100, catalog_connections(max_nodes))
            c.execute(text(f"ALTER SYSTEM SET max_connections = {slots}"))
        if pg_statements.out_dir() is not None:
            pg_statements.preload(admin)
        admin.dispose()
        self.pg.stop()
        self.database_url = self.pg.start()
        self.temporal = TemporalDevServer(self.work / "temporal.db", dynamic_config=ONE_PARTITION)
        self.temporal_address = self.temporal.start(log_file=self.work / "temporal.log")
        migrate.upgrade(self.database_url)
        self.engine = make_sync_engine(self.database_url, pool_size=2)
        with Session(self.engine) as s:
            token = tokens.create_token(s, "scale", [f"train:{JOB_PREFIX}"], None).secret
            s.commit()
        self.moto.start(log_file=self.work / "moto.log")
        self.s3 = boto3.client(
            "s3",
            endpoint_url=self.moto.endpoint_url,
            region_name="us-east-1",
            aws_access_key_id=self.moto.access_key_id,
            aws_secret_access_key=self.moto.secret_access_key,
        )
        self.s3.create_bucket(Bucket=self.bucket)
        self.local_root = str(self.work / "nodes" / "{node}")
        tiers = [
            {"name": "ssd", "kind": "local", "root": self.local_root},
            *(
                [{"name": "peer", "kind": "peer", "root": str(self.work / "peer" / "{node}")}]
                if peer_token
                else []
            ),
            *(
                [
                    {
                        "name": "coded",
                        "kind": "peer",
                        "root": str(self.work / "coded" / "{node}"),
                        "code": code,
                    }
                ]
                if peer_token and code
                else []
            ),
            {"name": "lustre", "kind": "shared", "root": str(self.work / "lustre")},
            {
                "name": "s3",
                "kind": "s3",
                "bucket": self.bucket,
                "endpoint_url": self.moto.endpoint_url,
                "region": "us-east-1",
            },
        ]
        self.env = tierpoint_env(
            self.work,
            self.database_url,
            self.temporal_address,
            tiers,
            {
                "AWS_ACCESS_KEY_ID": self.moto.access_key_id,
                "AWS_SECRET_ACCESS_KEY": self.moto.secret_access_key,
                **({"TIERPOINT_DATA_TOKEN": peer_token} if peer_token else {}),
            },
        )
        port, metrics = free_port(), free_port()
        self.metrics_url = f"http://127.0.0.1:{metrics}/metrics"
        api = [self.tierpoint, "api", "--host", "127.0.0.1", "--port", str(port)]
        self._start(self.procs, "api", [*api, "--metrics-port", str(metrics)])
        self._start(self.procs, "shared worker", [self.tierpoint, "worker"])
        self.api_url, self.token = f"http://127.0.0.1:{port}", token
        self.client = self.new_client()
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                self.client.tiers()
                return
            except Exception as e:
                self._check_alive(deadline, e)
                time.sleep(0.3)

    def local_dir(self, node: str, job: str, step: int) -> Path:
        return Path(self.local_root.replace("{node}", node)) / job / str(step)

    def new_client(self) -> Client:
        return Client(self.api_url, token=self.token)

    def start_nodes(self, nodes: list[str]) -> None:
        """Node workers for `nodes`, NODES_PER_PROCESS per process; returns once every node has
        reported in (registration accepts shards only on known nodes)."""
        since = self._now()
        for i in range(0, len(nodes), NODES_PER_PROCESS):
            cmd = [self.tierpoint, "worker", "--no-shared"]
            for n in nodes[i : i + NODES_PER_PROCESS]:
                cmd += ["--node", n]
            self._start(self.node_procs, f"node workers {len(self.node_procs) + 1}", cmd)
        deadline = time.monotonic() + START_TIMEOUT
        while self._seen(nodes, since) < len(nodes):
            self._check_alive(deadline, None)
            time.sleep(0.3)

    def stop_nodes(self) -> None:
        _stop_all(self.node_procs)
        self.node_procs.clear()

    def watched(self) -> dict[str, tuple[int, bool]]:
        found = {k: (p.pid, False) for k, p in {**self.procs, **self.node_procs}.items()}
        if self.stack is not None:
            return {**self.stack.pids(), **found}
        if self.moto.pid:
            found["moto"] = (self.moto.pid, False)
        if self.temporal is not None and self.temporal.pid:
            found["temporal"] = (self.temporal.pid, False)
        if self.pg is not None and self.pg.pid:
            found["postgres"] = (self.pg.pid, True)
        return found

    def close(self) -> None:
        try:
            _stop_all({**self.node_procs, **self.procs})
        finally:
            # Whatever failed above (or in the run), nothing the scenario started outlives it.
            self.moto.stop()
            if self.temporal is not None:
                self.temporal.stop()
            if hasattr(self, "engine"):
                self.engine.dispose()
            if self.pg is not None:
                self.pg.stop()
            # On the dev stack, the shards written to its nodes' roots go with it.
            if not self.keep:
                shutil.rmtree(self.work, ignore_errors=True)

    def _now(self) -> object:
        with self.engine.connect() as c:
            return c.scalar(select(func.now()))

    def _seen(self, nodes: list[str], since: object) -> int:
        with self.engine.connect() as c:
            seen = c.scalar(
                select(func.count()).where(Node.id.in_(nodes), Node.last_seen_at >= since)
            )
        return int(seen or 0)

    def _start(self, into: dict[str, subprocess.Popen[bytes]], label: str, cmd: list[str]) -> None:
        log = open(self.work / f"{label.replace(' ', '-')}.log", "ab")  # noqa: SIM115
        into[label] = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        log.close()

    def _check_alive(self, deadline: float, cause: Exception | None) -> None:
        dead = [k for k, p in {**self.procs, **self.node_procs}.items() if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            raise RuntimeError(f"{dead or 'the stack'} did not start: see {self.work}") from cause


def _stop_all(procs: dict[str, subprocess.Popen[bytes]]) -> None:
    for p in procs.values():
        p.terminate()
    for p in procs.values():
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)
