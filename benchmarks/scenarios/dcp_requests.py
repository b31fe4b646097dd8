"""API requests per `dcp.save` and per `dcp.load` at world sizes 1 to 16: what a training job
costs the tierpoint API as it grows, counted on the server (the sum of the API's
`tierpoint_api_requests_total` over every route and status, scraped from its own metrics
listener before and after each operation, once it has settled).

Each world size is a gloo group of real processes (benchmarks/dcp_rank_worker.py in the torch
venv) spread over the dev stack's two simulated nodes, rank r on node r % 2, saving and loading a
small state dict sharded over all ranks (every rank writes and reads its own file). Between the
save and the load the scenario waits, untimed and uncounted, until the checkpoint is restorable on
S3. The goal is the same count at every size.
"""

from __future__ import annotations

import functools
import itertools
import json
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path
from typing import IO, Any

from prometheus_client.parser import text_string_to_metric_families
from tierpoint_client import Client

from benchmarks.env import ROOT, DevStackProcess, Env, subprocess_env
from benchmarks.harness import Method, Outcome, Row, Scenario, Watched

WORKER = ROOT / "benchmarks" / "dcp_rank_worker.py"
WORLDS = (1, 2, 4, 8, 16)
WAIT = 600.0  # hang guard for the background copies
QUIET = 2.0  # seconds without a new request before a count is read


def api_requests(metrics_url: str) -> float:
    """Every request the API has counted so far."""
    with urllib.request.urlopen(metrics_url, timeout=10) as r:
        text = r.read().decode()
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        if family.name == "tierpoint_api_requests"
        for s in family.samples
        if s.name == "tierpoint_api_requests_total"
    )


def settled_requests(metrics_url: str) -> float:
    """The count once it has stopped changing for QUIET seconds. The API counts a request when
    its background work is done too (a lease's release asks Temporal for a retention run after
    the response), so a scrape right after an operation can miss its last requests."""
    last, since = api_requests(metrics_url), time.monotonic()
    while time.monotonic() - since < QUIET:
        time.sleep(0.1)
        now = api_requests(metrics_url)
        if now != last:
            last, since = now, time.monotonic()
    return last


def _label(op: str, world: int) -> str:
    # Compared to one rank's count: a ratio of 1.00 is a count that does not grow.
    return f"API requests per dcp.{op}, {world} rank" + ("s" if world != 1 else "")


class Group:
    """`world` rank processes of one gloo group; each command goes to every rank."""

    def __init__(self, python: Path, world: int, nodes: list[str], env: dict[str, str], work: Path):
        work.mkdir(parents=True, exist_ok=True)
        self._log: IO[bytes] = open(work / f"world{world}.log", "ab")  # noqa: SIM115
        self.log = work / f"world{world}.log"
        init = work / f"pg-{uuid.uuid4().hex[:8]}"
        cmd = [str(python), str(WORKER), "--world", str(world), "--init-file", str(init)]
        self.procs = [
            subprocess.Popen(
                [*cmd, "--rank", str(r)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._log,
                env=env | {"TIERPOINT_NODE": nodes[r % len(nodes)]},
                text=True,
            )
            for r in range(world)
        ]

    def ask(self, **cmd: Any) -> list[dict[str, Any]]:
        line = json.dumps(cmd) + "\n"
        for p in self.procs:
            assert p.stdin is not None
            p.stdin.write(line)
            p.stdin.flush()
        answers = []
        for p in self.procs:
            assert p.stdout is not None
            got = p.stdout.readline()
            if not got:
                raise RuntimeError(f"a DCP rank died on {cmd['op']}: see {self.log}")
            answers.append(json.loads(got))
        failed = [a["error"] for a in answers if not a["ok"]]
        if failed:
            raise RuntimeError(f"{cmd['op']} failed: {failed[0]} (see {self.log})")
        return answers

    def close(self) -> None:
        for p in self.procs:
            if p.stdin is not None:
                p.stdin.close()
        for p in self.procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
        self._log.close()


class DcpRequests(Scenario):
    name = "dcp_requests"
    summary = "API requests per dcp.save and per dcp.load at world sizes 1-16 (server-counted)"

    def __init__(self, env: Env, worlds: tuple[int, ...] = WORLDS) -> None:
        self.env, self.worlds = env, worlds
        self.work = env.work / self.name
        self.job = f"dcp-requests-{uuid.uuid4().hex[:6]}"
        self.steps = itertools.count(1)
        self.stack: DevStackProcess | None = None
        # One group alive at a time (16 torch processes are some GiB): the harness runs the
        # sizes in rotation, so a group is kept only while its size runs again next.
        self._group: tuple[int, Group] | None = None

    def params(self) -> dict[str, Any]:
        return {
            "worlds": list(self.worlds),
            "process": "one gloo process per rank, ranks on 2 simulated nodes",
            "state": "4 tensors of 64x256 float32, sharded over the ranks",
        }

    def watched(self) -> Watched:
        return dict(self.stack.pids()) if self.stack is not None else {}

    def prepare(self) -> list[Method]:
        self.python = self.env.torch_python()
        self.stack = self.env.stack()
        info = self.stack.info
        assert info is not None and info.metrics_url is not None
        self.metrics_url = info.metrics_url
        self.nodes = sorted(info.nodes)
        self.client = Client(info.api_url, token=info.token)
        self.rank_env = subprocess_env(
            {
                "TIERPOINT_API_URL": info.api_url,
                "TIERPOINT_TOKEN": info.token or "",
                "OMP_NUM_THREADS": "1",
                # The keys the stack's S3 tiers name (credentials_env), for loads from S3.
                **info.s3.credential_vars(),
            }
        )
        return [
            Method(
                f"world {n}",
                functools.partial(self._run, n),
                (
                    Row(_label("save", n), "save", _label("save", 1) if n != 1 else None, unit="n"),
                    Row(_label("load", n), "load", _label("load", 1) if n != 1 else None, unit="n"),
                ),
            )
            for n in self.worlds
        ]

    def _ranks(self, world: int) -> Group:
        if self._group is not None and self._group[0] != world:
            self._group[1].close()
            self._group = None
        if self._group is None:
            self._group = (world, Group(self.python, world, self.nodes, self.rank_env, self.work))
        return self._group[1]

    def _run(self, world: int) -> Outcome:
        """One save, then one load of it (the latest step of the world size's own job)."""
        group = self._ranks(world)
        job, step = f"{self.job}-w{world}", next(self.steps)
        before = settled_requests(self.metrics_url)
        group.ask(op="save", job=job, step=step)
        saved = settled_requests(self.metrics_url)
        self.client.wait_restorable(job, step, "s3", WAIT, 0.2)
        waited = settled_requests(self.metrics_url)
        answers = group.ask(op="load", job=job)
        loaded = settled_requests(self.metrics_url)
        if any(a["step"] != step or not a["equal"] for a in answers):
            raise RuntimeError(f"a load returned other values than were saved: {answers}")
        return Outcome({"save": saved - before, "load": loaded - waited})

    def close(self) -> None:
        if self._group is not None:
            self._group[1].close()
            self._group = None
