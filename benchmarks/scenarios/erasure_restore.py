"""The erasure scenario's restore rows, on a stack of its own (benchmarks/fleet.py: Postgres,
Temporal, moto, the API and a shared worker, each a process) with the tiers ssd -> peer (one full
copy on the next node of the ring) -> coded (rs(4,2): stripes on six other nodes) -> lustre ->
s3, and seven simulated nodes served by one node worker process, their data endpoints on
127.0.0.1.

A training process on node 0 saves its state once with `TierpointWriter` (its file and DCP's
`.metadata`), untimed; every tier's copy is made before anything is timed. Then node 0's files,
as a spare node restores them after node 0 is lost, in the same run:

- the client's restore (`restore_plan`, 4 files at a time, every file staged, checked, fsynced
  and renamed into place) from the peer tier's full copy on its holder's data endpoint, against
  the same restore from the coded tier: k stripes from k holders' data endpoints at once, each
  checked, decoded (the data stripes joined) and the file checked (`sources/coded.py`);
- `TierpointReader` (`dcp.load` into memory in the torch venv, repopulation off, `tier=` so every
  byte comes from the tier asked for) from the full copy against the same load from stripes.

Then one of a node's holders declared lost: the time until its full copies and its stripes are
verified again on new holders (erasure_rebuild).

Page caches of the stack's files are dropped before each run. On this machine every "network" is
loopback and every holder the same disk: the ratios say what the software costs.
"""

from __future__ import annotations

import shutil
import time
import uuid
from pathlib import Path
from typing import Any

from tierpoint_client.models import PlanEntry
from tierpoint_client.restore import restore_plan

from benchmarks.env import Env, subprocess_env
from benchmarks.fleet import JOB_PREFIX, Fleet
from benchmarks.harness import Method, Outcome, Row, Watched
from benchmarks.scenarios.copy_posix import drop_cache
from benchmarks.scenarios.dcp import Worker
from benchmarks.scenarios.erasure_rebuild import CodedRebuild

CODE = "rs(4,2)"
NODES = 7  # k+m+1: the shard's node and six holders
SECRET = "bench-worker-credential"
WAIT = 900.0
TENSORS = 4
RESTORE_COPY = "restore of a lost node's files from a holder's full copy (peer endpoint)"
RESTORE_CODED = f"restore of the same files from {CODE} stripes (4 holders' endpoints)"
LOAD_COPY = "TierpointReader load of a lost node's state from a holder's full copy"
LOAD_CODED = f"TierpointReader load of the same state from {CODE} stripes"


class CodedRestore:
    """The stack, the saved state and the methods of the restore rows."""

    def __init__(self, env: Env, work: Path, mib: int) -> None:
        self.env, self.work, self.mib = env, work, mib
        self.fleet = Fleet(work / "fleet", keep=env.keep)
        self.nodes = [f"coded-{i}" for i in range(NODES)]
        self.job = f"{JOB_PREFIX}erasure-{uuid.uuid4().hex[:6]}"
        self.worker: Worker | None = None
        self.plans: dict[str, list[PlanEntry]] = {}
        self.nbytes = 0

    def params(self) -> dict[str, Any]:
        return {
            "restore": f"{CODE} against one full copy (copies = 1), {NODES} nodes, one process",
            "restore files": {e.path: e.size for e in self.plans.get("peer", ())},
            "load": f"{TENSORS} float32 tensors, TierpointReader(tier=..., repopulate=False)",
            "rebuild": "node 1 of a group of 9 lost: node 0's full copy and a stripe of each file",
        }

    def watched(self) -> Watched:
        found = self.fleet.watched()
        if self.worker is not None:
            found["trainer"] = (self.worker.proc.pid, False)
        return found

    def prepare(self) -> list[Method]:
        fleet = self.fleet
        fleet.start(peer_token=SECRET, code=CODE)
        for node in self.nodes:
            for tier in ("peer", "coded"):
                (fleet.work / tier / node).mkdir(parents=True, exist_ok=True)
        fleet.start_nodes(self.nodes)
        variables = {
            "TIERPOINT_API_URL": fleet.api_url,
            "TIERPOINT_TOKEN": fleet.token,
            "TIERPOINT_NODE": self.nodes[0],
        }
        self.worker = w = Worker(
            self.env.torch_python(), subprocess_env(variables), self.work / "dcp-worker.log"
        )
        w.ask(op="init", mib=self.mib, tensors=TENSORS, pg_file=str(self.work / "dcp-pg"))
        w.ask(op="save", writer="tierpoint", mode="sync", job=self.job, step=1)
        for tier in ("peer", "coded", "lustre", "s3"):
            fleet.client.wait_restorable(self.job, 1, tier, WAIT, 0.05)
        for tier in ("peer", "coded"):
            latest = fleet.client.latest(self.job, tier=tier)
            assert latest is not None and latest.step == 1
            self.plans[tier] = list(latest.plan)
        if not all(e.code == CODE for e in self.plans["coded"]):
            raise RuntimeError(f"the coded tier's plan is not of stripes: {self.plans['coded']}")
        self.nbytes = sum(e.size for e in self.plans["peer"])
        n = self.nbytes
        spare = self.nodes[-1]
        return [
            Method(
                RESTORE_COPY,
                lambda: self._restore("peer"),
                (Row(RESTORE_COPY, nbytes=n),),
                before=self._drop,
                after=self._clear,
            ),
            Method(
                RESTORE_CODED,
                lambda: self._restore("coded"),
                (Row(RESTORE_CODED, baseline=RESTORE_COPY, nbytes=n),),
                before=self._drop,
                after=self._clear,
            ),
            Method(
                LOAD_COPY,
                lambda: self._load("peer", spare),
                (Row(LOAD_COPY, nbytes=n),),
                before=self._drop,
            ),
            Method(
                LOAD_CODED,
                lambda: self._load("coded", spare),
                (Row(LOAD_CODED, baseline=LOAD_COPY, nbytes=n),),
                before=self._drop,
            ),
            *CodedRebuild(fleet, self.mib).methods(),
        ]

    @property
    def dest(self) -> Path:
        return self.work / "dest"

    def _drop(self) -> None:
        drop_cache(self.fleet.work)

    def _clear(self) -> None:
        shutil.rmtree(self.dest, ignore_errors=True)

    def _restore(self, tier: str) -> Outcome:
        tiers = {t.name: t for t in self.fleet.client.tiers()}
        plan = self.plans[tier]
        t0 = time.perf_counter()
        files = restore_plan(plan, self.dest, tiers, workers=4, token=self.fleet.token).files
        seconds = time.perf_counter() - t0
        # Every byte from the tier asked for: a fallback to another copy would show here.
        if any(f.tier != tier for f in files) or sum(f.size for f in files) != self.nbytes:
            raise RuntimeError(f"the restore from {tier} read {files}")
        return Outcome({"seconds": seconds})

    def _load(self, tier: str, node: str) -> Outcome:
        assert self.worker is not None
        answer = self.worker.ask(
            op="load",
            reader="tierpoint",
            job=self.job,
            step=1,
            tier=tier,
            node=node,
            repopulate=False,
        )
        if not answer["equal"]:
            raise RuntimeError(f"the load from {tier} returned other values than were saved")
        if set(answer["stats"]["files"].values()) != {tier}:
            raise RuntimeError(f"the load from {tier} read {answer['stats']['files']}")
        return Outcome({"seconds": float(answer["seconds"]), "cpu": float(answer["cpu"])})

    def close(self) -> None:
        try:
            if self.worker is not None:
                self.worker.close()
        finally:
            self.fleet.close()
