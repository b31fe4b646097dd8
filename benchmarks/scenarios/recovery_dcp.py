"""The recovery scenario's DCP rows, on its stack with a peer tier (peer_stack, 64 MiB and up):
rank 1's state loaded with `TierpointReader` (`dcp.load` into the training process's memory, in
the torch venv: benchmarks/dcp_worker.py) on the spare node, from its peer copy, from the shared
tier and from S3, against the same load on rank 1's own node from its local tier.

The state is saved once, untimed, with `TierpointWriter` by a training process on rank 1's node
(one rank: its file and DCP's `.metadata` are on that node, as a rank's own file is; the
lifecycle copies them down the tiers, the peer copy to the next node of the ring), and every
tier's copy is made before anything is timed. Each load names its node and restricts the reader
to one tier (`TierpointReader(node=..., tier=...)`), so every byte comes from the source asked
for; the "bytes read" rows count the bytes of the files the reader says it read from that tier
(a fallback to another copy would show there). Nothing is written back: re-population of the
spare node's local tier is off, so each load is the read into memory alone. Page caches of the
stack's files are dropped before each run. The training process is the spare node as well as
rank 1's own: only the node it names and the tier differ between the rows. Beside each load's
time, the training process's CPU seconds in `dcp.load` (all its threads; and of them in the
kernel: on loopback a socket's receive path is the loader's), and for the peer load
the CPU of the node worker process serving the holder's endpoint over the load (with its own
polling beside it): the per-byte costs docs/benchmarks.md scales to a cluster's links.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from benchmarks.env import Env, subprocess_env
from benchmarks.fleet import JOB_PREFIX
from benchmarks.harness import Method, Outcome, Row
from benchmarks.procs import cpu_seconds
from benchmarks.scenarios.copy_posix import drop_cache
from benchmarks.scenarios.dcp import Worker
from benchmarks.scenarios.peer_stack import WAIT, PeerStack
from benchmarks.scenarios.stack_ckpt import MiB

PT = "4 nodes, peer tier"
DCP = f"{PT}, TierpointReader"
DCP_LOCAL = f"{DCP}: rank 1's state on its own node from its local tier"
DCP_PEER = f"{DCP}: rank 1's state on the spare node from its peer copy"
DCP_SHARED = f"{DCP}: rank 1's state on the spare node from the shared tier"
DCP_S3 = f"{DCP}: rank 1's state on the spare node from S3"
DCP_S3_VS_PEER = f"{DCP_S3}, against the peer copy's"
TENSORS = 4  # as the restore rows' 4 files per rank
SPARE = 3  # peer_stack's node 3


class DcpRecovery:
    """The training process and the methods of the DCP rows."""

    def __init__(self, env: Env, stack: PeerStack, work: Path) -> None:
        self.env, self.stack, self.work = env, stack, work
        self.worker: Worker | None = None
        self.job = f"{JOB_PREFIX}recovery-dcp-{uuid.uuid4().hex[:6]}"
        self.sizes: dict[str, int] = {}
        self.tensor_bytes = 0
        # The node worker process serving the loads' group, the peer copy's holder among it.
        self.holder: int | None = None

    def params(self) -> dict[str, Any]:
        return {
            "dcp state": f"{TENSORS} float32 tensors, {self.tensor_bytes:,} B",
            "dcp files": self.sizes,
            "dcp reader": "TierpointReader(node=..., tier=..., repopulate=False), 1 rank",
        }

    def watched(self) -> dict[str, tuple[int, bool]]:
        return {} if self.worker is None else {"trainer": (self.worker.proc.pid, False)}

    def prepare(self, nodes: list[str]) -> list[Method]:
        fleet = self.stack.fleet
        try:
            python = self.env.torch_python()
        except Exception as e:
            raise RuntimeError(
                "recovery: the TierpointReader rows (the peer-tier stack, 64 MiB and up) load in "
                "the torch venv, which is missing and could not be made: run `python3 bootstrap.py "
                f"torch-venv` ({e})"
            ) from e
        variables = {
            "TIERPOINT_API_URL": fleet.api_url,
            "TIERPOINT_TOKEN": fleet.token,
            "TIERPOINT_NODE": nodes[1],
            "AWS_ENDPOINT_URL": fleet.moto.endpoint_url,
            "AWS_ACCESS_KEY_ID": fleet.moto.access_key_id,
            "AWS_SECRET_ACCESS_KEY": fleet.moto.secret_access_key,
            "AWS_DEFAULT_REGION": "us-east-1",
        }
        self.work.mkdir(parents=True, exist_ok=True)
        self.worker = w = Worker(python, subprocess_env(variables), self.work / "dcp-worker.log")
        mib = max(1, self.stack.size * self.stack.shards // MiB)
        init = w.ask(op="init", mib=mib, tensors=TENSORS, pg_file=str(self.work / "dcp-pg"))
        self.tensor_bytes = int(init["bytes"])
        w.ask(op="save", writer="tierpoint", mode="sync", job=self.job, step=1)
        for tier in ("peer", "lustre", "s3"):
            fleet.client.wait_restorable(self.job, 1, tier, WAIT, 0.05)
        cp = fleet.client.checkpoint(self.job, 1)
        self.sizes = {sh.path: sh.size for sh in cp.shards or ()}
        if {sh.node for sh in cp.shards or ()} != {nodes[1]}:
            raise RuntimeError(f"{self.job}: its files are not all on {nodes[1]}")
        holders = {r.node for sh in cp.shards or () for r in sh.replicas if r.tier == "peer"}
        if not holders <= set(nodes):
            raise RuntimeError(f"{self.job}: its peer copies are on {holders}, not in {nodes}")
        # The group's node workers are the process started last (peer_stack starts one a group).
        self.holder = list(fleet.node_procs.values())[-1].pid
        n = sum(self.sizes.values())
        spare = nodes[SPARE]
        return [
            self._method(DCP_LOCAL, nodes[1], "ssd", Row(DCP_LOCAL, nbytes=n)),
            self._method(DCP_PEER, spare, "peer", Row(DCP_PEER, baseline=DCP_LOCAL, nbytes=n)),
            self._method(
                DCP_SHARED, spare, "lustre", Row(DCP_SHARED, baseline=DCP_LOCAL, nbytes=n)
            ),
            self._method(
                DCP_S3,
                spare,
                "s3",
                Row(DCP_S3, baseline=DCP_LOCAL, nbytes=n),
                Row(DCP_S3_VS_PEER, baseline=DCP_PEER, nbytes=n),
            ),
        ]

    def _method(self, label: str, node: str, tier: str, *rows: Row) -> Method:
        bytes_row = Row(f"{label}: bytes read from that tier", "bytes", unit="n")
        cpu = f"{label}: the loader's CPU"
        extra = [Row(cpu, "cpu"), Row(f"{cpu}, of it in the kernel", "cpu system")]
        if tier == "peer":
            extra.append(Row(f"{label}: the holder's node worker CPU", "holder cpu"))

        def run() -> Outcome:
            assert self.worker is not None and self.holder is not None
            holder = cpu_seconds(self.holder)
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
                raise RuntimeError(f"{label}: the load returned other values than were saved")
            stats = answer["stats"]
            if stats["repopulated"]:
                raise RuntimeError(f"{label}: the load wrote {stats['repopulated']} to disk")
            # Every byte from the tier asked for: a file read from elsewhere would show here.
            read = sum(self.sizes[p] for p, how in stats["files"].items() if how == tier)
            metrics = {"seconds": float(answer["seconds"]), "bytes": float(read)}
            metrics["cpu"] = float(answer["cpu"])
            metrics["cpu system"] = float(answer["cpu_system"])
            metrics["holder cpu"] = cpu_seconds(self.holder) - holder
            return Outcome(metrics)

        return Method(label, run, (*rows, bytes_row, *extra), before=self._drop)

    def _drop(self) -> None:
        drop_cache(self.stack.fleet.work)

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()
