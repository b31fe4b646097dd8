"""torch.distributed.checkpoint through tierpoint against DCP's FileSystemWriter on the local disk
and s3torchconnector's S3StorageWriter straight to S3 (the dev stack's moto, the endpoint
tierpoint's S3 tier uses), for the same state dict, in one training process (benchmarks/
dcp_worker.py in the torch venv, a gloo group of one).

- save: how long `dcp.save` blocks training. TierpointWriter returns once the files are on the
  node's local tier and registered; the copies to the shared tier and S3 follow in the background,
  and "restorable on S3" is the catalog's time for that (from the save's start).
- floor: the state's tensor bytes written and fsynced to the same disk by the training process,
  with nothing of DCP's or ours: what no writer can beat there. Each sync save is compared to it.
- async save: how long `dcp.async_save` blocks (until its future is returned) and its total time.
The s3torchconnector client uses 256 MiB parts (see dcp_worker.py: moto and ranged GETs). Loads
are the dcp_load scenario's.

Every tierpoint save waits, untimed, until its copies are restorable on the shared tier and S3,
so the next run does not compete with the background copies.
"""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import IO, Any

import boto3
from tierpoint_client import Client

from apps.devstack.facts import StackInfo
from benchmarks.env import ROOT, DevStackProcess, Env, subprocess_env
from benchmarks.harness import Method, Outcome, Row, Scenario, Watched
from benchmarks.scenarios.s3_upload import empty_bucket

WORKER = ROOT / "benchmarks" / "dcp_worker.py"
BUCKET = "tp-bench-dcp"
WAIT = 900.0  # hang guard for the background copies

TP, FS, S3 = "TierpointWriter", "FileSystemWriter", "S3StorageWriter"
FLOOR = "floor: the tensors' bytes written + fsynced"


def stack_s3(info: StackInfo) -> Any:
    """A boto3 S3 client of the dev stack's endpoint, with its credentials."""
    s3 = info.s3
    return boto3.client(
        "s3",
        endpoint_url=s3.endpoint_url,
        region_name=s3.region,
        aws_access_key_id=s3.access_key_id,
        aws_secret_access_key=s3.secret_access_key,
    )


def trainer_env(info: StackInfo, node: str) -> dict[str, str]:
    """The environment of a training process on the dev stack, on `node`."""
    s3 = info.s3
    return subprocess_env(
        {
            "TIERPOINT_API_URL": info.api_url,
            "TIERPOINT_TOKEN": info.token or "",
            "TIERPOINT_NODE": node,
            # s3torchconnector's client takes the endpoint from the environment only.
            "AWS_ENDPOINT_URL": s3.endpoint_url,
            "AWS_ACCESS_KEY_ID": s3.access_key_id,
            "AWS_SECRET_ACCESS_KEY": s3.secret_access_key,
            "AWS_DEFAULT_REGION": s3.region,
            # tierpoint's reader signs with the keys the stack's S3 tiers name (credentials_env).
            **s3.credential_vars(),
        }
    )


class Worker:
    """The torch process: one JSON request, one JSON answer."""

    def __init__(self, python: Path, env: dict[str, str], log: Path) -> None:
        self._log: IO[bytes] = open(log, "ab")  # noqa: SIM115
        self.log = log
        self.proc = subprocess.Popen(
            [str(python), str(WORKER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=env,
            text=True,
        )

    def ask(self, **cmd: Any) -> dict[str, Any]:
        self.send(**cmd)
        return self.receive(cmd["op"])

    def send(self, **cmd: Any) -> None:
        """The request alone: the ranks of one process group must all get theirs first."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def receive(self, op: str) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the DCP worker died on {op}: see {self.log}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()


class Dcp(Scenario):
    name = "dcp"
    summary = "dcp.save / async_save: TierpointWriter vs FileSystemWriter and S3StorageWriter"

    def __init__(self, env: Env, mib: int, tensors: int = 16) -> None:
        self.env, self.mib, self.tensors = env, mib, tensors
        self.work = env.work / self.name
        self.job = f"dcp-bench-{uuid.uuid4().hex[:6]}"
        self.steps = itertools.count(1)
        self.nbytes = 0
        self.worker: Worker | None = None
        self.stack: DevStackProcess | None = None

    def params(self) -> dict[str, Any]:
        return {
            "bytes": self.nbytes,
            "tensors": self.tensors,
            "process": "1 rank, gloo",
            "s3_part_mib": 256,
        }

    def watched(self) -> Watched:
        found = dict(self.stack.pids()) if self.stack is not None else {}
        if self.worker is not None:
            found["trainer"] = (self.worker.proc.pid, False)
        return found

    def prepare(self) -> list[Method]:
        python = self.env.torch_python()
        self.stack = self.env.stack()
        info = self.stack.info
        assert info is not None
        self.node = next(iter(info.nodes))
        self.client = Client(info.api_url, token=info.token)
        self.s3 = stack_s3(info)
        self.s3.create_bucket(Bucket=BUCKET)
        self.work.mkdir(parents=True)
        env = trainer_env(info, self.node)
        self.worker = Worker(python, env, self.work.parent / "dcp-worker.log")
        init = self.worker.ask(
            op="init", mib=self.mib, tensors=self.tensors, pg_file=str(self.work / "pg")
        )
        self.nbytes = int(init["bytes"])
        return self._save_methods("sync") + self._save_methods("async")

    # -- saves -----------------------------------------------------------------------------

    def _save_methods(self, mode: str) -> list[Method]:
        verb = "save" if mode == "sync" else "async_save"
        n = self.nbytes
        # What the training job waits for with S3StorageWriter until the checkpoint is on S3.
        s3_done = f"{S3} {verb}" if mode == "sync" else f"{S3} {verb} total"
        rows: dict[str, tuple[Row, ...]] = {
            TP: (
                Row(f"{TP} {verb}", "blocking", f"{S3} {verb}", n),
                Row(f"{TP} {verb} (vs local disk)", "blocking", f"{FS} {verb}", n),
                Row(f"{TP} {verb}: restorable on S3", "on_s3", s3_done, n),
                # What the shared tier's copy costs beside a save to a file system.
                Row(f"{TP} {verb}: restorable on the shared tier", "on_shared", f"{FS} {verb}", n),
            ),
            FS: (Row(f"{FS} {verb}", "blocking", None, n),),
            S3: (Row(f"{S3} {verb}", "blocking", None, n),),
        }
        if mode == "async":
            rows[TP] += (Row(f"{TP} {verb} total", "total", f"{S3} {verb} total", n),)
            rows[FS] += (Row(f"{FS} {verb} total", "total", None, n),)
            rows[S3] += (Row(f"{S3} {verb} total", "total", None, n),)
        floor: list[Method] = []
        if mode == "sync":
            rows[TP] += (Row(f"{TP} {verb} (vs the floor)", "blocking", FLOOR, n),)
            rows[FS] += (Row(f"{FS} {verb} (vs the floor)", "blocking", FLOOR, n),)
            floor.append(
                Method(
                    FLOOR,
                    self._floor,
                    (Row(FLOOR, "seconds", f"{S3} {verb}", n),),
                    after=lambda: shutil.rmtree(self.work / "floor", ignore_errors=True),
                )
            )
        return [
            *floor,
            Method(f"{TP} {verb}", lambda: self._save_tierpoint(mode), rows[TP]),
            Method(
                f"{FS} {verb}",
                lambda: self._save_other("fs", mode),
                rows[FS],
                after=lambda: shutil.rmtree(self.work / "fs-save", ignore_errors=True),
            ),
            Method(
                f"{S3} {verb}",
                lambda: self._save_other("s3", mode),
                rows[S3],
                after=lambda: self._empty_prefix("save/"),
            ),
        ]

    def _save_tierpoint(self, mode: str) -> Outcome:
        assert self.worker is not None
        step = next(self.steps)
        r = self.worker.ask(op="save", writer="tierpoint", mode=mode, job=self.job, step=step)
        on_shared, on_s3 = self._restorable_at(self.job, step)
        return Outcome(
            {
                "blocking": r["blocking"],
                "total": r["total"],
                "on_s3": on_s3 - float(r["start"]),
                "on_shared": on_shared - float(r["start"]),
            }
        )

    def _restorable_at(self, job: str, step: int) -> tuple[float, float]:
        """The catalog's times at which `job`/`step` became restorable on the shared tier and
        on S3 (epoch seconds), waiting for both so that no copy runs on into the next
        measurement."""
        self.client.wait_restorable(job, step, "lustre", WAIT, 0.1)
        cp = self.client.wait_restorable(job, step, "s3", WAIT, 0.1)
        at = [cp.tier(t) for t in ("lustre", "s3")]
        assert all(s is not None and s.restorable_at is not None for s in at), cp
        shared, s3 = (s.restorable_at.timestamp() for s in at if s and s.restorable_at)
        return shared, s3

    def _floor(self) -> Outcome:
        assert self.worker is not None
        # On the disk of FileSystemWriter's baseline, which is the local tier's disk too.
        r = self.worker.ask(op="floor", path=str(self.work / "floor"))
        return Outcome({"seconds": r["seconds"]})

    def _save_other(self, kind: str, mode: str) -> Outcome:
        assert self.worker is not None
        path = str(self.work / "fs-save") if kind == "fs" else f"s3://{BUCKET}/save/"
        r = self.worker.ask(op="save", writer=kind, mode=mode, path=path)
        return Outcome({"blocking": r["blocking"], "total": r["total"]})

    def _empty_prefix(self, prefix: str) -> None:
        # moto keeps objects in memory: a finished run's baseline objects go.
        empty_bucket(self.s3, BUCKET, prefix)

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()
        if hasattr(self, "s3"):
            empty_bucket(self.s3, BUCKET)
            self.s3.delete_bucket(Bucket=BUCKET)
        shutil.rmtree(self.work, ignore_errors=True)
