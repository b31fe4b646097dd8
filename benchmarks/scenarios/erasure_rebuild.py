"""The erasure scenario's rebuild row, on the restore rows' stack (erasure_restore): one node
declared lost, and the time until each tier holds again what it held.

Each run takes a group of nodes of its own (a node declared lost stays lost): node 0 of the group
writes its shards and registers them (untimed, every tier's copy made), so its full copy lands on
node 1 (the peer tier: the next node of the ring) and its rs(4,2) stripes on nodes 1 to 6 (the
first k+m nodes of its preference list). Node 1 then holds both a full copy and a stripe of every
file: declaring it lost (`POST /v1/nodes/{node}/lost`, as an operator does) starts one
`PeerRereplicate`, which copies the full copies again onto a new holder and cuts the stripes
again on another, at the same time. The catalog tells the two apart: the run polls the shards'
peer replicas and their stripes and reports, from the declaration, when every full copy was
verified on a live holder again and when every stripe set was whole again (all k+m verified,
none on the lost node). Both share the run's window and this machine's cores, so each is timed
beside the other, as an operator meets them.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

import httpx
from sqlalchemy.orm import Session

from benchmarks.fleet import JOB_PREFIX, Fleet
from benchmarks.harness import Method, Outcome, Row
from benchmarks.scenarios.stack_ckpt import MiB, manifest, shard_names, write_shards
from tierpoint.catalog.stripe.rebuilding import stripe_sets
from tierpoint.catalog.token import tokens

WIDTH = 6  # rs(4,2)
GROUP = 9  # the writer, its six stripe holders (the first also its full copy's), two spares
SHARDS = 4
WAIT = 900.0
POLL = 0.05
REREPLICATION = "node lost: its full copies verified again on a new holder (re-replication)"
REBUILD = "node lost: its rs(4,2) stripes verified again on new holders (rebuild)"


@dataclass
class Lost:
    job: str
    checkpoint_id: int
    node: str  # the node declared lost
    shards: int


class CodedRebuild:
    def __init__(self, fleet: Fleet, mib: int) -> None:
        self.fleet = fleet
        self.size = mib * MiB // SHARDS
        self.groups = 0
        self.admin = ""
        self.ready: Lost | None = None

    def methods(self) -> list[Method]:
        n = self.size * SHARDS
        with Session(self.fleet.engine) as s:
            self.admin = tokens.create_token(s, "bench-rebuild-admin", ["admin"], None).secret
            s.commit()
        rows = (
            Row(REREPLICATION, metric="rereplication", nbytes=n),
            Row(REBUILD, metric="rebuild", baseline=REREPLICATION, nbytes=n),
        )
        return [
            Method("node lost: re-replication and rebuild", self._run, rows, before=self._group)
        ]

    def _group(self) -> None:
        """A new group of nodes, node 0's checkpoint on every tier, and the node to lose."""
        self.ready = None
        fleet = self.fleet
        nodes = [f"rebuild-{self.groups:02d}-{i}" for i in range(GROUP)]
        self.groups += 1
        for node in nodes:
            for tier in ("peer", "coded"):
                (fleet.work / tier / node).mkdir(parents=True, exist_ok=True)
        fleet.start_nodes(nodes)
        job = f"{JOB_PREFIX}rebuild-{uuid.uuid4().hex[:6]}"
        names = shard_names(SHARDS, "rank0")
        block = bytes(range(256)) * (min(self.size, 16 * MiB) // 256 + 1)
        crcs = write_shards(fleet.local_dir(nodes[0], job, 1), names, self.size, block)
        fleet.client.register_manifest(job, 1, manifest(names, self.size, crcs, nodes[0]))
        # Every tier's copy made: the lifecycle's copies must not run beside the timed rebuild.
        for tier in ("peer", "coded", "lustre", "s3"):
            fleet.client.wait_restorable(job, 1, tier, WAIT, POLL)
        cp = fleet.client.checkpoint(job, 1)
        assert cp.id is not None
        peer = {r.node or "" for sh in cp.shards or () for r in sh.replicas if r.tier == "peer"}
        with Session(fleet.engine) as s:
            sets = stripe_sets(s, cp.id, "coded")
        coded = {m.node for st in sets for m in st.members}
        # The node holding both a full copy and a stripe of every file: one loss, both tiers.
        if len(peer) != 1 or not peer <= coded or len(sets) != SHARDS:
            raise RuntimeError(f"placement not as planned: full copies on {peer}, stripes {sets}")
        self.ready = Lost(job, cp.id, peer.pop(), SHARDS)

    def _run(self) -> Outcome:
        lost = self.ready
        if lost is None:
            raise RuntimeError("no group was prepared for this run")
        self.ready = None  # a lost node stays lost: every run needs a group of its own
        t0 = time.perf_counter()
        r = httpx.post(
            f"{self.fleet.api_url}/v1/nodes/{lost.node}/lost",
            headers={"Authorization": f"Bearer {self.admin}"},
            timeout=60,
        )
        if r.status_code != 200 or r.json().get("peer_rereplications") != 1:
            raise RuntimeError(f"declaring {lost.node} lost answered {r.status_code} {r.text}")
        done: dict[str, float] = {}
        while len(done) < 2 and time.perf_counter() - t0 < WAIT:
            if "rereplication" not in done and self._copies_back(lost):
                done["rereplication"] = time.perf_counter() - t0
            if "rebuild" not in done and self._stripes_back(lost):
                done["rebuild"] = time.perf_counter() - t0
            time.sleep(POLL)
        failed = {
            m: f"TimeoutError: not done {WAIT:.0f} s after the declaration"
            for m in ("rereplication", "rebuild")
            if m not in done
        }
        return Outcome(done, failed=failed)

    def _copies_back(self, lost: Lost) -> bool:
        cp = self.fleet.client.checkpoint(lost.job, 1)
        held = [
            r
            for sh in cp.shards or ()
            for r in sh.replicas
            if r.tier == "peer" and r.state == "verified" and r.node != lost.node
        ]
        return len(held) == lost.shards

    def _stripes_back(self, lost: Lost) -> bool:
        with Session(self.fleet.engine) as s:
            sets = stripe_sets(s, lost.checkpoint_id, "coded")
        return len(sets) == lost.shards and all(
            len(st.members) == WIDTH
            and all(m.state == "verified" and m.node != lost.node for m in st.members)
            for st in sets
        )
