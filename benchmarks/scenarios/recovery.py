"""Recovery: a lost node's files loaded on a spare node, in the same run, from a peer (the node's
data endpoint, as a peer tier's holder serves its copies), from the shared tier and from S3, each
against a local load: the same files read on their own node from its local tier. Every load is the
client's restore (`restore_plan`: every shard read once, checked against its registered crc32c,
fsynced and renamed into place, 4 files at a time).

The checkpoint (the end_to_end size) is written on one node of the dev stack and waited for until
it is restorable on S3. The data endpoint is the node worker's own server
(`tierpoint/services/data_endpoint.py`), run here against the stack's catalog and serving that
node's local tier: the bytes, the server and the client's reader are a peer copy's; only the
file's directory differs (the dev stack has no peer tier). The endpoint runs in a process of its
own from OWN_PROCESS_FROM bytes up, in this one below (the CI smoke's tiny run). Page caches of
the sources and the destination are dropped before each run. Rows: each load against the local
load, S3's also against the peer's (a ratio above 1: the peer was that much faster), and the
bytes each load read from its source.

From OWN_PROCESS_FROM bytes up, also a stack of its own with a peer tier (peer_stack): a 2-rank
job on 4 simulated nodes, rank 1's files loaded on the spare node from their peer copy against
their local load, and the time from declaring rank 1's node lost until every shard has a peer
copy on a live node again (PeerRereplicate); and in the same group, rank 1's state loaded with
`TierpointReader` (DCP into memory, in the torch venv: recovery_dcp) on the spare node from its
peer copy, the shared tier and S3, against the same load on its own node from its local tier.
On this machine every "network" is loopback and the shared tier a local disk: the ratios say
what the software costs, not what a cluster's links would give (see docs/benchmarks.md).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tierpoint_client.models import PlanEntry
from tierpoint_client.restore import restore_plan

from benchmarks.env import Env, subprocess_env
from benchmarks.harness import Method, Outcome, Row, Scenario, Watched
from benchmarks.scenarios.copy_posix import drop_cache
from benchmarks.scenarios.orchestration import stack_env
from benchmarks.scenarios.peer_stack import PeerStack
from benchmarks.scenarios.recovery_child import Endpoint
from benchmarks.scenarios.recovery_dcp import PT, DcpRecovery
from benchmarks.scenarios.stack_ckpt import MiB, Stack
from tierpoint.storage.base import ShardRef
from tierpoint.storage.peer_http import shard_url

LOCAL = "local load (the node's own local tier)"
PEER = "load from a peer's data endpoint"
SHARED = "load from the shared tier"
S3 = "load from S3"
S3_VS_PEER = "load from S3, against the peer's"
STEP = 1
# Runs of at least this many bytes serve the peer's endpoint from a process of its own.
OWN_PROCESS_FROM = 64 * MiB
SECRET = "bench-worker-credential"
# With a peer tier (peer_stack: 4 simulated nodes, a 2-rank job, rank 1's node lost).
PT_LOCAL = f"{PT}: rank 1's files, local load on its own node"
PT_PEER = f"{PT}: rank 1's files on the spare node from their peer copy"
PT_REREPLICATE = f"{PT}: node lost -> every shard's peer copy again (PeerRereplicate)"
# Where each load reads: the plan's tier (the peer's copies are the local tier's, served).
SOURCES = {LOCAL: "ssd", PEER: "peer", SHARED: "lustre", S3: "s3"}


class Recovery(Scenario):
    name = "recovery"
    summary = "a lost node's files loaded from a peer, the shared tier, S3 vs a local load"

    def __init__(self, env: Env, mib: int, shards: int) -> None:
        self.env, self.shards = env, shards
        self.size = mib * MiB // shards
        self.nbytes = self.size * shards
        self.work = env.work / self.name
        self.job = f"recovery-{uuid.uuid4().hex[:6]}"
        self.stack: Stack | None = None
        self.server: subprocess.Popen[bytes] | None = None
        self.inline: Endpoint | None = None
        self.url = ""
        self.node = ""
        self.plans: dict[str, list[PlanEntry]] = {}
        self.peer_stack: PeerStack | None = None
        self.dcp: DcpRecovery | None = None
        self.pending: tuple[str, list[str]] | None = None

    def params(self) -> dict[str, Any]:
        return {
            "bytes": self.nbytes,
            "shards": self.shards,
            "client workers": 4,
            "spare node": "the bench process",
            "peer": "its endpoint's process" if self.server is not None else "in this process",
            **(self.dcp.params() if self.dcp is not None else {}),
        }

    def watched(self) -> Watched:
        # The loads run in this process ("bench"), the peer's endpoint in its own.
        found = dict(self.stack.watched()) if self.stack is not None else {}
        if self.server is not None:
            found["peer endpoint"] = (self.server.pid, False)
        if self.peer_stack is not None:
            found.update({f"peer stack {k}": v for k, v in self.peer_stack.watched().items()})
        if self.dcp is not None:
            found.update(self.dcp.watched())
        return found

    def prepare(self) -> list[Method]:
        self.stack = stack = Stack(self.env)
        # The endpoint's process starts while the checkpoint is written and copied.
        self._serve(stack.nodes[0])
        self.node = node = stack.restorable_everywhere(self.job, STEP, self.shards, self.size)
        self.url = self._url()
        for tier in ("ssd", "lustre", "s3"):
            # The local tier's copies count only on their own node: the local load's.
            latest = stack.client.latest(self.job, tier=tier, node=node if tier == "ssd" else None)
            assert latest is not None and latest.step == STEP, tier
            self.plans[tier] = [e for e in latest.plan if e.tier == tier]
        self.plans["peer"] = [self._via_endpoint(e) for e in self.plans["lustre"]]
        self.work.mkdir(parents=True)
        n = self.nbytes
        methods = []
        for label, source in SOURCES.items():
            rows = [
                Row(label, baseline=None if label == LOCAL else LOCAL, nbytes=n),
                Row(f"{label}: bytes read", "bytes", unit="n"),
            ]
            if label == S3:
                rows.insert(1, Row(S3_VS_PEER, baseline=PEER, nbytes=n))
            methods.append(self._method(label, source, tuple(rows)))
        if self.nbytes >= OWN_PROCESS_FROM:  # a stack of its own: not for the CI smoke
            methods += self._peer_tier()
        return methods

    def _peer_tier(self) -> list[Method]:
        self.peer_stack = stack = PeerStack(self.work / "peer-stack", self.nbytes // 2, 4)
        stack.start()
        # The loads' group: its node 1 is never declared lost (each PeerRereplicate run takes a
        # group of its own), so its local copies stay the catalog's verified ones.
        job, nodes = stack.group()
        self.plans.update({f"{PT} {k}": v for k, v in stack.plans(job, nodes[1]).items()})
        self.dcp = DcpRecovery(self.env, stack, self.work / "dcp")
        n = stack.size * stack.shards
        drop = self._drop_peer_stack
        return [
            Method(PT_LOCAL, lambda: self._load(f"{PT} local"), (Row(PT_LOCAL, nbytes=n),), drop),
            Method(
                PT_PEER,
                lambda: self._load(f"{PT} peer"),
                (Row(PT_PEER, baseline=PT_LOCAL, nbytes=n),),
                drop,
                self._clear,
            ),
            Method(PT_REREPLICATE, self._rereplicate, (Row(PT_REREPLICATE),), self._new_group),
            *self.dcp.prepare(nodes),
        ]

    def _drop_peer_stack(self) -> None:
        assert self.peer_stack is not None
        drop_cache(self.peer_stack.fleet.work)

    def _load(self, source: str) -> Outcome:
        assert self.peer_stack is not None
        fleet = self.peer_stack.fleet
        tiers = {t.name: t for t in fleet.client.tiers()}
        t0 = time.perf_counter()
        restore_plan(self.plans[source], self.dest, tiers, workers=4, token=fleet.token)
        seconds = time.perf_counter() - t0
        self._clear()
        return Outcome({"seconds": seconds})

    def _new_group(self) -> None:
        """A group whose node 1 is still alive (untimed: starting its workers, its checkpoint)."""
        assert self.peer_stack is not None
        if self.pending is None:
            self.pending = self.peer_stack.group()

    def _rereplicate(self) -> Outcome:
        assert self.peer_stack is not None and self.pending is not None
        (job, nodes), self.pending = self.pending, None
        return Outcome({"seconds": self.peer_stack.lose(job, nodes[1])})

    def _serve(self, node: str) -> None:
        """Start `node`'s data endpoint: in a process of its own (recovery_child), or in this one
        for a tiny run (the CI smoke's), where starting another interpreter would cost more than
        all of its loads."""
        assert self.stack is not None
        variables = {**stack_env(self.stack.process.data_dir), "TIERPOINT_DATA_TOKEN": SECRET}
        if self.nbytes < OWN_PROCESS_FROM:
            from benchmarks.scenarios.recovery_child import serve_node

            self.inline = serve_node(variables, node)
            return
        child = "benchmarks.scenarios.recovery_child"
        self.server = subprocess.Popen(
            [sys.executable, "-m", child, node],
            env=subprocess_env({**variables, "TIERPOINT_LOG_LEVEL": "WARNING"}),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )

    def _url(self) -> str:
        """The endpoint's URL, once it serves."""
        if self.inline is not None:
            return self.inline.url
        assert self.server is not None and self.server.stdout is not None
        line = self.server.stdout.readline()
        if not line:
            raise RuntimeError(f"the data endpoint exited with {self.server.wait()}")
        url: str = json.loads(line)["url"]
        return url

    def _via_endpoint(self, shared: PlanEntry) -> PlanEntry:
        """The same shard, read over the node's data endpoint from its local tier."""
        url = shard_url(self.url, "ssd", ShardRef(self.job, STEP, shared.path))
        return PlanEntry(
            shared.path, shared.size, shared.crc32c, "ssd", "peer", self.node, url, url=url
        )

    def _method(self, name: str, source: str, rows: tuple[Row, ...]) -> Method:
        return Method(
            name, lambda: self._restore(source), rows, before=self._drop, after=self._clear
        )

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

    def _restore(self, source: str) -> Outcome:
        assert self.stack is not None
        tiers = {t.name: t for t in self.stack.client.tiers()}
        plan = self.plans[source]
        t0 = time.perf_counter()
        # The job's API token, as a restore on a spare node sends it: checked on every request.
        token = self.stack.info.token
        files = restore_plan(plan, self.dest, tiers, workers=4, token=token).files
        seconds = time.perf_counter() - t0
        if sum(f.size for f in files) != self.nbytes:
            raise RuntimeError(f"restore from {source} wrote {sum(f.size for f in files)} B")
        # Every byte from the source asked for: a fallback to another copy would show here.
        read = sum(f.size for f in files if f.tier == plan[0].tier)
        return Outcome({"seconds": seconds, "bytes": float(read)})

    def close(self) -> None:
        if self.server is not None:
            assert self.server.stdin is not None
            self.server.stdin.close()
            try:
                self.server.wait(30)
            except subprocess.TimeoutExpired:
                self.server.kill()
                self.server.wait(10)
        if self.inline is not None:
            self.inline.close()
        if self.dcp is not None:
            self.dcp.close()
        if self.peer_stack is not None:
            self.peer_stack.close()
        if self.stack is not None:
            self.stack.forget(self.job)
        shutil.rmtree(self.work, ignore_errors=True)
