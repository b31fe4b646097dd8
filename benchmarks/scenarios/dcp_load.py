"""dcp.load through TierpointReader against DCP's FileSystemReader reading the same state dict
from the same disk in the same page-cache state, and against s3torchconnector's S3StorageReader
from the same S3 endpoint (the dev stack's moto).

The matrix: two shapes of state dict ("large": few large tensors, 64 MiB each; "many": 16 MiB
tensors, each followed by a 4 KiB bias, and an int), 1 and 2 ranks (every rank holds the whole,
replicated state and loads all of it, from both ranks' files), hot (every file the method reads
is in the page cache) and cold (every file dropped from the page cache first, fsync +
POSIX_FADV_DONTNEED), and for tierpoint the local and the shared tier. Each row's ratio is to
FileSystemReader of the same shape, ranks and cache state, run interleaved with it. From S3 (1
rank): TierpointReader against S3StorageReader reading whole objects (`sequential`).

Each group of ranks is started, and each (ranks, shape)'s checkpoints saved, when the first method
that loads them runs (untimed, before it): a run of some methods (`--method`) saves only what they
load, so a 1 GiB matrix of one group fits a tmpfs work dir (`--dir /dev/shm`).
"""

from __future__ import annotations

import itertools
import shutil
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tierpoint_client import Client

from benchmarks.env import DevStackProcess, Env
from benchmarks.harness import Method, Outcome, Row, Scenario, Watched
from benchmarks.scenarios.copy_posix import drop_cache
from benchmarks.scenarios.dcp import Worker, stack_s3, trainer_env
from benchmarks.scenarios.s3_upload import empty_bucket

BUCKET = "tp-bench-dcp-load"
WAIT = 900.0
SHAPES = ("large", "many")
LARGE_MIB = 64  # the "large" shape's tensors
FS, S3_SEQ = "FileSystemReader", "S3StorageReader (sequential)"


class DcpLoad(Scenario):
    name = "dcp_load"
    summary = "dcp.load: TierpointReader vs FileSystemReader (hot, cold) and S3StorageReader"

    def __init__(self, env: Env, mib: int, worlds: tuple[int, ...] = (1, 2)) -> None:
        self.env, self.mib, self.worlds = env, mib, worlds
        self.work = env.work / self.name
        self.job = f"dcp-load-{uuid.uuid4().hex[:6]}"
        self.groups: dict[int, list[Worker]] = {}
        self.nbytes: dict[str, int] = {}
        # Per (ranks, shape): the files each method reads (by tier, "fs"), once they are saved.
        self.saved: dict[tuple[int, str], dict[str, list[Path]]] = {}
        self.s3_saved: set[str] = set()
        self.stack: DevStackProcess | None = None
        self.pg = itertools.count()

    def params(self) -> dict[str, Any]:
        return {
            "bytes": self.nbytes,
            "shapes": {
                "large": f"{self._large()} tensors of {self.mib // self._large()} MiB",
                "many": "16 MiB tensors (smaller below 64 MiB), a 4 KiB bias after each, an int",
            },
            "ranks": list(self.worlds),
            "cold": "every file of the checkpoint fsynced + POSIX_FADV_DONTNEED before each run",
            "hot": "every file the method reads read once before each run",
        }

    def _large(self) -> int:
        return max(1, self.mib // LARGE_MIB)

    def watched(self) -> Watched:
        found = dict(self.stack.pids()) if self.stack is not None else {}
        for world, workers in self.groups.items():
            for rank, w in enumerate(workers):
                found[f"trainer {rank}/{world}" if world > 1 else "trainer"] = (w.proc.pid, False)
        return found

    def prepare(self) -> list[Method]:
        self.python = self.env.torch_python()
        self.stack = self.env.stack()
        info = self.stack.info
        assert info is not None
        self.node = next(iter(info.nodes))
        self.client = Client(info.api_url, token=info.token)
        self.s3 = stack_s3(info)
        self.s3.create_bucket(Bucket=BUCKET)
        self.work.mkdir(parents=True)
        # Every rank on one node: its local tier has all the files.
        self.trainer_env = trainer_env(info, self.node)
        self._group(1)  # the state's sizes, for the rows
        methods: list[Method] = []
        for world in self.worlds:
            for shape in SHAPES:
                methods += self._prepare_shape(world, shape)
        return methods

    def _group(self, world: int) -> list[Worker]:
        """The `world` ranks, started (each holding every shape's state) on first use."""
        if world not in self.groups:
            log = self.work.parent / "dcp-worker.log"
            pg = self.work / f"pg-{world}"
            self.groups[world] = [Worker(self.python, self.trainer_env, log) for _ in range(world)]
            answers = self._all(
                world,
                op="init",
                mib=self.mib,
                tensors=self._large(),
                shapes=list(SHAPES),
                pg_file=str(pg),
                world=world,
                rank=None,
            )
            self.nbytes = {s: int(answers[0][f"bytes_{s}"]) for s in SHAPES}
        return self.groups[world]

    def _all(self, group: int, **cmd: Any) -> list[dict[str, Any]]:
        """The same request to every rank of the group of `group` ranks (rank=None: each its
        own), then the answers: a collective needs all ranks in it at once."""
        workers = self._group(group)
        for rank, w in enumerate(workers):
            w.send(**{**cmd, "rank": rank} if "rank" in cmd else cmd)
        return [w.receive(cmd["op"]) for w in workers]

    def _prepare_shape(self, world: int, shape: str) -> list[Method]:
        """The methods that load the (ranks, shape)'s checkpoints (tierpoint's on the local and
        the shared tier, FileSystemWriter's, for 1 rank S3StorageWriter's): saved by `_saved`."""
        n = self.nbytes[shape]
        tag = f"{shape}, {world} rank{'s' if world > 1 else ''}"
        job = f"{self.job}-{world}r-{shape}"
        fs_dir = self.work / f"fs-{world}r-{shape}"
        methods: list[Method] = []
        for cache in ("hot", "cold"):
            base = f"{tag}, {cache}: {FS}"
            methods.append(
                self._method(
                    base,
                    world,
                    (Row(base, "seconds", None, n),),
                    (world, shape, "fs"),
                    cache,
                    reader="fs",
                    path=str(fs_dir),
                    shape=shape,
                )
            )
            for tier, what in (("ssd", "local tier"), ("lustre", "shared tier")):
                label = f"{tag}, {cache}: TierpointReader from the {what}"
                methods.append(
                    self._method(
                        label,
                        world,
                        (Row(label, "seconds", base, n),),
                        (world, shape, tier),
                        cache,
                        reader="tierpoint",
                        job=job,
                        step=1,
                        tier=tier,
                        shape=shape,
                    )
                )
        if world == 1:
            methods += self._s3_methods(job, shape, tag, n)
        return methods

    def _saved(self, world: int, shape: str) -> dict[str, list[Path]]:
        """The (ranks, shape)'s checkpoints, saved on first use: tierpoint's (restorable on every
        tier, so that no copy runs beside a timed load) and FileSystemWriter's; their files."""
        key = (world, shape)
        if key not in self.saved:
            job = f"{self.job}-{world}r-{shape}"
            self._all(
                world, op="save", writer="tierpoint", mode="sync", job=job, step=1, shape=shape
            )
            self.client.wait_restorable(job, 1, "lustre", WAIT, 0.1)
            cp = self.client.wait_restorable(job, 1, "s3", WAIT, 0.1)
            files = {
                tier: [
                    Path(r.location)
                    for sh in cp.shards or ()
                    for r in sh.replicas
                    if r.tier == tier and r.location
                ]
                for tier in ("ssd", "lustre")
            }
            fs_dir = self.work / f"fs-{world}r-{shape}"
            self._all(world, op="save", writer="fs", mode="sync", path=str(fs_dir), shape=shape)
            files["fs"] = [p for p in fs_dir.rglob("*") if p.is_file()]
            self.saved[key] = files
        return self.saved[key]

    def _s3_methods(self, job: str, shape: str, tag: str, n: int) -> list[Method]:
        prefix = f"s3://{BUCKET}/{shape}/"
        base = f"{tag}: {S3_SEQ}"
        label = f"{tag}: TierpointReader from S3"
        return [
            self._method(
                base,
                1,
                (Row(base, "seconds", None, n),),
                (1, shape, "s3"),
                "cold",
                reader="s3-sequential",
                path=prefix,
                shape=shape,
            ),
            self._method(
                label,
                1,
                (Row(label, "seconds", base, n),),
                (1, shape, "s3"),
                "cold",
                reader="tierpoint",
                job=job,
                step=1,
                tier="s3",
                shape=shape,
            ),
        ]

    def _method(
        self,
        name: str,
        world: int,
        rows: tuple[Row, ...],
        reads: tuple[int, str, str],
        cache: str,
        **cmd: Any,
    ) -> Method:
        """`reads`: (ranks, shape, what): the files of "fs", "ssd", "lustre", or "s3" (S3 has no
        page cache: always cold)."""

        def run() -> Outcome:
            answers = self._all(world, op="load", **cmd)
            if not all(a["equal"] for a in answers):
                raise RuntimeError(f"a load returned other values than were saved: {cmd}")
            # Each rank timed from a common barrier to a common barrier: the job's wait.
            return Outcome({"seconds": max(float(a["seconds"]) for a in answers)})

        def before() -> None:
            group, shape, what = reads
            files = self._saved(group, shape)
            if what == "s3":
                self._saved_s3(shape)
            if cache == "cold":
                self._drop_all()
            else:
                _warm(files[what])

        return Method(name, run, rows, before=before)

    def _saved_s3(self, shape: str) -> None:
        """S3StorageWriter's checkpoint of the shape (1 rank), saved on first use."""
        if shape not in self.s3_saved:
            prefix = f"s3://{BUCKET}/{shape}/"
            self._all(1, op="save", writer="s3", mode="sync", path=prefix, shape=shape)
            self.s3_saved.add(shape)

    def _drop_all(self) -> None:
        assert self.stack is not None
        for root in (self.stack.data_dir / "nodes", self.stack.data_dir / "lustre", self.work):
            drop_cache(root)

    def close(self) -> None:
        for workers in self.groups.values():
            for w in workers:
                w.close()
        if hasattr(self, "s3"):
            empty_bucket(self.s3, BUCKET)
            self.s3.delete_bucket(Bucket=BUCKET)
        shutil.rmtree(self.work, ignore_errors=True)


def _warm(files: Iterable[Path]) -> None:
    """Every page of the files in the page cache, as after a recent save or load."""
    buf = memoryview(bytearray(8 * 1024 * 1024))
    for path in files:
        with open(path, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass
