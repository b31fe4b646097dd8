"""An upgrade rehearsal: the order "Upgrades and migrations" in docs/deployment.md gives, run with
checkpoints in flight and requests going to the API all the time.

The old version: a copy of this repository's code, run as processes with its venv (two API
replicas behind a Service stand-in, the node worker of each of two nodes, a shared worker). The
new version: a second copy with one more, additive migration on top of the newest (a nullable
column and an index). Each
workload is rolled in the documented order: the migration applied by the new copy while the old
processes serve, then every replica replaced by a process of the new copy (a node worker's old
process first, as the DaemonSet does; a Deployment's new replica first). Before each step a new
checkpoint is registered through the API and is still copying when the step begins (reads off the
node are throttled, so its copy takes seconds).

Checked: the old code refuses the migrated schema at start (so the new processes that start are
the new copy's); every lifecycle completes; every tier of every checkpoint is restorable and the
catalog agrees with the bytes on every tier; every old process exits cleanly; no request fails
(no 5xx, no refused connection) and every API replica, old and new, answered some."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, text
from temporalio.client import Client

from apps.devstack.services import free_port
from tests.helpers.consistency import assert_catalog_matches_tiers
from tests.helpers.faults import db_now, workers_reported_in
from tests.helpers.lifecycle import NODES, crc_hex
from tests.helpers.rehearsal import REPO, WAIT, Endpoints, Proc, build_process, copy_build, wait_for
from tests.helpers.tokens import create_token
from tests.helpers.worker_process import settings_env
from tierpoint.catalog import migrate
from tierpoint.config import Settings
from tierpoint.contract.lifecycle import LifecycleResult, workflow_id
from tierpoint.states import TierState

DOC = REPO / "docs" / "deployment.md"
MIGRATE, NODE_WORKER, WORKER, API = (
    "tierpoint-migrate",
    "tierpoint-node-worker",
    "tierpoint-worker",
    "tierpoint-api",
)
SHARD = 2 * 1024 * 1024
# A shard's copy off its node takes >= 2 s whatever the machine: a checkpoint registered just
# before a step is still copying when the step begins (checked, not assumed).
READ_LIMIT = 1024 * 1024
PAUSE = 0.05  # between two requests of the background traffic
MIGRATION = '''"""upgrade rehearsal: an additive change on top of the newest migration

Revision ID: {revision}
Revises: {down}
"""

import sqlalchemy as sa
from alembic import op

revision = "{revision}"
down_revision = "{down}"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("checkpoint", sa.Column("rehearsal_note", sa.Text(), nullable=True))
    op.create_index("ix_checkpoint_rehearsal_note", "checkpoint", ["rehearsal_note"])


def downgrade() -> None:
    op.drop_index("ix_checkpoint_rehearsal_note", table_name="checkpoint")
    op.drop_column("checkpoint", "rehearsal_note")
'''


def documented_order() -> list[str]:
    """The workloads of the numbered steps of "Upgrades and migrations", in their order."""
    text = DOC.read_text()
    start = text.index("## Upgrades and migrations\n")
    section = text[start : text.find("\n## ", start + 1)]
    return re.findall(r"^\d+\. \*\*`(tierpoint-[a-z-]+)`\*\*", section, re.M)


def _steps(section: str) -> dict[str, str]:
    parts = re.split(r"^\d+\. \*\*`(tierpoint-[a-z-]+)`\*\*", section, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_the_upgrade_order_names_every_workload_once_and_its_commands_agree() -> None:
    order = documented_order()
    # The migration first: it is what the old version must keep working with.
    assert order[0] == MIGRATE and sorted(order) == sorted({MIGRATE, NODE_WORKER, WORKER, API})
    text = DOC.read_text()
    start = text.index("## Upgrades and migrations\n")
    steps = _steps(text[start : text.find("\n## ", start + 1)])
    for name, body in steps.items():
        component = name.removeprefix("tierpoint-")
        assert f"-l app.kubernetes.io/component={component}\n" in body, name
        if name != MIGRATE:
            assert re.search(rf"rollout status (daemonset|deployment)/{name} ", body), name


@dataclass
class Traffic:
    """Requests to the API through the Service stand-in, every answer counted."""

    endpoints: Endpoints
    token: str
    answered: Counter[str] = field(default_factory=Counter)  # replica URL -> 2xx answers
    failures: list[str] = field(default_factory=list)
    _clients: dict[str, httpx.Client] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        with self.endpoints.pick() as url:
            with self._lock:
                if url not in self._clients:
                    auth = {"Authorization": f"Bearer {self.token}"}
                    self._clients[url] = httpx.Client(base_url=url, headers=auth, timeout=30)
                http = self._clients[url]
            try:
                resp = http.request(method, path, json=body)
            except httpx.HTTPError as exc:
                self.failures.append(f"{method} {url}{path}: {exc!r}")
                return 0, None
        if not resp.is_success:
            self.failures.append(f"{method} {url}{path}: {resp.status_code} {resp.text[:300]}")
            return resp.status_code, None
        self.answered[url] += 1
        return resp.status_code, resp.json()

    def background(self, stop: threading.Event, paths: Callable[[], list[str]]) -> None:
        while not stop.is_set():
            for path in paths():
                self.request("GET", path)
                time.sleep(PAUSE)

    def close(self) -> None:
        for http in self._clients.values():
            http.close()


@dataclass
class Rollout:
    """The old and new builds' processes and what the rehearsal saw."""

    settings: Settings
    engine: Engine
    work: Path
    new_build: Path
    traffic: Traffic
    api: list[Proc] = field(default_factory=list)
    worker: list[Proc] = field(default_factory=list)
    node_worker: dict[str, Proc] = field(default_factory=dict)
    registered: list[tuple[str, int]] = field(default_factory=list)
    exits: dict[str, int | None] = field(default_factory=dict)

    def process(self, build: Path, args: list[str], tag: str, ports: dict[str, int]) -> Proc:
        env = settings_env(self.settings)
        return build_process(build, env, args, self.work / "logs" / f"{tag}.log", ports)

    def api_process(self, build: Path, tag: str) -> Proc:
        port = free_port()
        args = ["api", "--host", "127.0.0.1", "--port", str(port)]
        return self.process(build, args, tag, {"http": port})

    def worker_process(self, build: Path, tag: str, node: str | None) -> Proc:
        port = free_port()
        args = ["worker", "--metrics-port", str(port)]
        args += ["--node", node, "--no-shared"] if node else []
        return self.process(build, args, tag, {"metrics": port})

    def start(self, proc: Proc) -> Proc:
        """Started and ready (the API's readiness probe; a worker's metrics, served once its
        schema check passed)."""
        proc.start()
        wait_for(proc, url(proc))
        return proc

    def stop(self, proc: Proc) -> None:
        proc.stop()
        assert proc.popen is not None
        self.exits[proc.name] = proc.popen.returncode

    def register(self) -> None:
        """A checkpoint of one shard per node, through the API, still copying when this returns."""
        job, step = f"upgrade-{uuid.uuid4().hex[:8]}", 1
        local = self.settings.local_tier()
        assert local is not None
        shards = []
        for node in NODES:
            data = os.urandom(SHARD)
            path = f"rank-{node}/shard.bin"
            file = local.root_for(node) / job / str(step) / path
            file.parent.mkdir(parents=True)
            file.write_bytes(data)
            shards.append({"path": path, "size": SHARD, "crc32c": crc_hex(data), "node": node})
        body = {"step": step, "shards": shards, "metadata": {}}
        status, _ = self.traffic.request("POST", f"/v1/jobs/{job}/checkpoints", body)
        assert status in (200, 201), self.traffic.failures[-1:]
        self.registered.append((job, step))
        _, cp = self.traffic.request("GET", f"/v1/jobs/{job}/checkpoints/{step}")
        states = {t["tier"]: t["state"] for t in cp["tiers"]}
        assert states["s3"] != "restorable", "the copy finished at once: lower READ_LIMIT"

    def old_fleet(self, build: Path) -> list[Proc]:
        """The old version's replicas (not started): two API, a shared worker, a node worker per
        node."""
        self.api = [self.api_process(build, f"api-{i}-old") for i in range(2)]
        self.worker = [self.worker_process(build, "worker-0-old", None)]
        for node in NODES:
            self.node_worker[node] = self.worker_process(build, f"node-worker-{node}-old", node)
        return [*self.api, *self.worker, *self.node_worker.values()]

    async def started(self, procs: list[Proc]) -> None:
        """All started at once, ready, the node workers reported in, the API in the rotation."""
        since = db_now(self.engine)
        for proc in procs:
            proc.start()
        for proc in procs:
            await asyncio.to_thread(wait_for, proc, url(proc))
        await workers_reported_in(self.engine, NODES, since)
        for proc in self.api:
            self.traffic.endpoints.add(base(proc))

    # -- the steps, by workload ------------------------------------------------------------

    def migrate(self) -> None:
        proc = self.process(self.new_build, ["migrate"], "migrate-new", {})
        assert proc.run() == 0, proc.output()
        # The old code refuses this schema at start: what starts from now on is the new copy.
        with pytest.raises(migrate.SchemaMismatch, match="newer than this tierpoint"):
            migrate.check_schema(self.engine)
        with self.engine.connect() as conn:
            added = conn.scalar(
                text(
                    "SELECT count(*) FROM information_schema.columns "
                    "WHERE table_name = 'checkpoint' AND column_name = 'rehearsal_note'"
                )
            )
        assert added == 1

    def node_workers(self) -> None:
        for node in NODES:  # the DaemonSet: maxUnavailable 1, the old pod goes first
            self.stop(self.node_worker[node])
            new = self.worker_process(self.new_build, f"node-worker-{node}-new", node)
            self.node_worker[node] = self.start(new)

    def workers(self) -> None:
        for i, old in enumerate(self.worker):  # a Deployment: the new pod first
            self.worker[i] = self.start(
                self.worker_process(self.new_build, f"worker-{i}-new", None)
            )
            self.stop(old)

    def apis(self) -> None:
        for i, old in enumerate(self.api):  # maxSurge 1, maxUnavailable 0
            new = self.start(self.api_process(self.new_build, f"api-{i}-new"))
            self.traffic.endpoints.add(base(new))
            self.traffic.endpoints.remove(base(old))
            self.api[i] = new
            self.stop(old)

    def roll(self, workload: str) -> None:
        {MIGRATE: self.migrate, NODE_WORKER: self.node_workers, WORKER: self.workers}.get(
            workload, self.apis
        )()


def base(proc: Proc) -> str:
    return f"http://127.0.0.1:{proc.ports['http']}"


def url(proc: Proc) -> str:
    if "http" in proc.ports:
        return base(proc) + "/readyz"
    return f"http://127.0.0.1:{proc.ports['metrics']}/metrics"


def new_build(old: Path, work: Path) -> Path:
    """A copy of the old build with one more migration on top of the newest one."""
    build = Path(shutil.copytree(old, work / "new-build"))
    down = migrate.head_revision()
    revision = f"{down}_rehearsal"
    versions = build / "migrations" / "versions"
    (versions / f"{revision}.py").write_text(MIGRATION.format(revision=revision, down=down))
    return build


@pytest.mark.slow
async def test_a_rolling_upgrade_in_the_documented_order_fails_nothing(
    settings: Settings, engine: Engine, client: Client, tmp_path: Path
) -> None:
    order = documented_order()
    ssd = settings.tiers[0].model_copy(update={"read_bandwidth_limit": READ_LIMIT})
    throttled = settings.model_copy(update={"tiers": [ssd, *settings.tiers[1:]]})
    traffic = Traffic(Endpoints(), create_token(engine))
    old_build = copy_build(tmp_path / "old-build")
    rollout = Rollout(throttled, engine, tmp_path, new_build(old_build, tmp_path), traffic)
    old = rollout.old_fleet(old_build)
    stop = threading.Event()
    load: asyncio.Future[None] | None = None
    try:
        await rollout.started(old)

        def paths() -> list[str]:
            job, step = rollout.registered[-1]
            return ["/v1/tiers", f"/v1/jobs/{job}/checkpoints/{step}", "/v1/jobs?limit=20"]

        await asyncio.to_thread(rollout.register)
        load = asyncio.ensure_future(asyncio.to_thread(traffic.background, stop, paths))
        for workload in order:
            await asyncio.to_thread(rollout.register)
            await asyncio.to_thread(rollout.roll, workload)

        results = []
        for job, step in rollout.registered:
            handle = client.get_workflow_handle(workflow_id(job, step), result_type=LifecycleResult)
            results.append(await asyncio.wait_for(handle.result(), WAIT))
        stop.set()
        await load
        await _every_tier_restorable(rollout, results)
        assert traffic.failures == []
        replicas = {base(p) for p in [*old[:2], *rollout.api]}
        assert set(traffic.answered) == replicas and all(traffic.answered.values())
        assert all(
            p.alive() for p in [*rollout.api, *rollout.worker, *rollout.node_worker.values()]
        )
        # Each ended on its SIGTERM within the grace period (uvicorn re-raises the signal).
        assert set(rollout.exits) == {p.name for p in old}, rollout.exits
        assert set(rollout.exits.values()) <= {0, -signal.SIGTERM}, rollout.exits
    finally:
        stop.set()
        if load is not None:
            await asyncio.gather(load, return_exceptions=True)
        traffic.close()
        for proc in [*old, *rollout.api, *rollout.worker, *rollout.node_worker.values()]:
            proc.stop()


async def _every_tier_restorable(rollout: Rollout, results: list[LifecycleResult]) -> None:
    """Every lifecycle's outcome, what the API says and the bytes on every tier agree: each
    checkpoint restorable on each tier, with its checksums verified."""
    for result in results:
        assert {t.state for t in result.tiers} == {TierState.RESTORABLE}, result
    for job, step in rollout.registered:
        path = f"/v1/jobs/{job}/checkpoints/{step}"
        _, cp = await asyncio.to_thread(rollout.traffic.request, "GET", path)
        assert {t["state"] for t in cp["tiers"]} == {"restorable"}, cp
    ids = [r.checkpoint_id for r in results]
    checked = assert_catalog_matches_tiers(rollout.settings, rollout.engine, ids)
    everywhere = Counter({tier: len(results) for tier in rollout.settings.tier_names()})
    assert checked.restorable == everywhere, checked
