"""The recovery scenario's stack with a peer tier: services of its own (benchmarks/fleet.py:
Postgres, Temporal, moto, the API and a shared worker, each a process) with the tiers ssd -> peer
-> lustre -> s3, and groups of 4 simulated nodes served by node worker processes (their data
endpoints serve the peer copies). In each group a 2-rank job writes a checkpoint, rank r on node
r; the ring puts node 0's copies on node 1 and node 1's on node 2. Declaring node 1 lost loses
rank 1's local copies and the peer copies of rank 0 it held: re-replication (PeerRereplicate)
makes those again on node 2, and rank 1 restarts on node 3, the spare, reading its files from
node 2's endpoint.

A node declared lost stays lost, so each measurement of re-replication takes a group of its own.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import httpx
from sqlalchemy.orm import Session
from tierpoint_client.models import PlanEntry

from benchmarks.fleet import JOB_PREFIX, Fleet
from benchmarks.harness import Watched
from benchmarks.scenarios.stack_ckpt import MiB, manifest, shard_names, write_shards
from tierpoint.catalog.token import tokens

SECRET = "bench-worker-credential"
WAIT = 600.0
RANKS = 2
NODES = 4  # ranks 0 and 1, the holder of rank 1's copies, a spare


class PeerStack:
    def __init__(self, work: Path, rank_bytes: int, shards_per_rank: int) -> None:
        self.work = work
        self.size = rank_bytes // shards_per_rank
        self.shards = shards_per_rank
        self.fleet = Fleet(work)
        self.groups = 0

    def start(self) -> None:
        self.fleet.start(peer_token=SECRET)
        with Session(self.fleet.engine) as s:
            self.admin = tokens.create_token(s, "bench-admin", ["admin"], None).secret
            s.commit()

    def watched(self) -> Watched:
        return self.fleet.watched()

    def group(self) -> tuple[str, list[str]]:
        """A new group of nodes and the job it wrote, restorable on the peer tier."""
        nodes = [f"peer-{self.groups:02d}-{i}" for i in range(NODES)]
        self.groups += 1
        for node in nodes:
            (self.fleet.work / "peer" / node).mkdir(parents=True, exist_ok=True)
        self.fleet.start_nodes(nodes)
        job = f"{JOB_PREFIX}recovery-{uuid.uuid4().hex[:6]}"
        specs = []
        block = bytes(range(256)) * (min(self.size, 16 * MiB) // 256 + 1)
        for rank, node in enumerate(nodes[:RANKS]):
            names = shard_names(self.shards, f"rank{rank}")
            crcs = write_shards(self.fleet.local_dir(node, job, 1), names, self.size, block)
            specs += manifest(names, self.size, crcs, node)
        self.fleet.client.register_manifest(job, 1, specs)
        # Every tier's copy made: the lifecycle's copies must not run beside the measured loads.
        for tier in ("peer", "lustre", "s3"):
            self.fleet.client.wait_restorable(job, 1, tier, WAIT, 0.05)
        return job, nodes

    def plans(self, job: str, node: str) -> dict[str, list[PlanEntry]]:
        """`node`'s files: its own local copies, and its peer copies on their holder."""
        cp = self.fleet.client.checkpoint(job, 1)
        local = [
            PlanEntry.of_replica(sh, r, "local")
            for sh in cp.shards or ()
            for r in sh.replicas
            if r.tier == "ssd" and r.node == node and r.state == "verified"
        ]
        paths = {e.path for e in local}
        latest = self.fleet.client.latest(job, tier="peer")
        assert latest is not None and latest.step == 1
        peer = [e for e in latest.plan if e.path in paths and e.tier == "peer"]
        assert len(peer) == len(local) == self.shards, (local, peer)
        return {"local": local, "peer": peer}

    def lose(self, job: str, node: str) -> float:
        """Declare `node` lost; the seconds until every shard has a verified peer copy on a live
        node again and the peer tier is restorable (PeerRereplicate finished)."""
        t0 = time.perf_counter()
        r = httpx.post(
            f"{self.fleet.api_url}/v1/nodes/{node}/lost",
            headers={"Authorization": f"Bearer {self.admin}"},
            timeout=60,
        )
        if r.status_code != 200 or r.json().get("peer_rereplications") != 1:
            raise RuntimeError(f"declaring {node} lost answered {r.status_code} {r.text}")
        while time.perf_counter() - t0 < WAIT:
            cp = self.fleet.client.checkpoint(job, 1)
            restorable = any(t.tier == "peer" and t.state == "restorable" for t in cp.tiers)
            held = [
                r
                for sh in cp.shards or ()
                for r in sh.replicas
                if r.tier == "peer" and r.state == "verified" and r.node != node
            ]
            if restorable and len(held) == len(cp.shards or ()):
                return time.perf_counter() - t0
            time.sleep(0.05)
        raise TimeoutError(f"the peer copies of {job} were not made again in {WAIT:.0f} s")

    def close(self) -> None:
        self.fleet.close()
