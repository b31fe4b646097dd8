"""Rules of the stateful machine that restore, as a restarting job does with the training client
(no DCP): from one tier, or from one tier's plan with every other verified copy to fall back on;
while the node holding the peer copies being read dies (its worker and data endpoint killed
mid-restore, then started again); and while a retention run expires the step being restored.

Every restore is held to one rule: it never fails while each shard has a verified copy it may
read (on a restorable tier that is not quarantined; a local copy only on the restoring node; not
one the test damaged, nor one on the node it killed), it returns the registered bytes, and it
never reads a copy quarantined on its tier."""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from botocore.exceptions import ClientError
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule
from tierpoint_client import Client
from tierpoint_client.errors import TierpointError
from tierpoint_client.models import LatestCheckpoint, RestoreResult

from tests.stateful import checks
from tests.stateful.model import LOCAL, PEERS, SHARED, TIERS, StepModel
from tests.stateful.rules_data import DataRules
from tests.stateful.rules_ops import OpsRules
from tests.stateful.stack import SETTLE_TIMEOUT

RESTORE_FAILED = (TierpointError, OSError, ClientError)
# Marker states a copy being restored must never reach while the restore's lease holds it.
GONE = frozenset({"expiring", "expired"})
Copies = dict[str, list[tuple[str, str | None]]]


class RestoreRules(DataRules, OpsRules):
    def client(self) -> Client:
        return Client(self.stack.api.url, token=self.train)

    def readable(
        self, sm: StepModel, only: str | None, node: str | None, down: frozenset[str]
    ) -> Copies:
        """path -> the (tier, node) of each copy a restore may read: verified, on a restorable
        tier neither it nor the checkpoint quarantined, `only` that tier if given, a local copy
        only on `node`, none on a node in `down`, none the test damaged."""
        cp = self.checkpoint(sm.step)
        if cp is None or cp["quarantine_reason"]:
            return {p: [] for p in sm.shards}
        usable = {
            t["tier"]
            for t in cp["tiers"]
            if t["state"] == "restorable" and not t["quarantine_reason"]
        }
        out: Copies = {p: [] for p in sm.shards}
        for s in cp["shards"]:
            for r in s["replicas"]:
                tier, at = r["tier"], r["node"]
                if r["state"] != "verified" or tier not in usable or (only and tier != only):
                    continue
                if (tier == LOCAL and at != node) or at in down or (tier, s["path"]) in sm.damage:
                    continue
                out[s["path"]].append((tier, at))
        return out

    def restored(
        self,
        sm: StepModel,
        may_read: Copies,
        what: str,
        run: Callable[[Path], RestoreResult],
    ) -> RestoreResult | None:
        """`run` into a fresh directory, held to the restore's rule; None when it failed with
        a shard left without a copy it may read (the failure is then no bug)."""
        dest = Path(tempfile.mkdtemp(prefix="sf-restore-"))
        try:
            try:
                result = run(dest)
            except RESTORE_FAILED as err:
                if any(not copies for copies in may_read.values()):
                    self.model.count(f"{what}: failed, a shard without a copy to read")
                    return None
                raise AssertionError(
                    f"{what} of step {sm.step} failed while every shard had a verified copy it "
                    f"may read {may_read}: {err!r}"
                ) from err
            got = {f.path: (dest / f.path).read_bytes() for f in result.files}
            assert got == {p: s.data for p, s in sm.shards.items()}, f"{what}: bytes differ"
            read = {(f.tier, f.path) for f in result.files}
            quarantined = {(t, p) for t, p in read if t in sm.tier_quarantined}
            assert not quarantined, f"{what} of step {sm.step} read quarantined {quarantined}"
            return result
        finally:
            shutil.rmtree(dest, ignore_errors=True)

    def latest_step(self, latest: LatestCheckpoint | None) -> StepModel | None:
        if latest is None:
            return None
        sm = self.model.steps.get(latest.step)
        assert sm is not None, f"restore offers step {latest.step}, never registered"
        return sm

    @rule(tier=st.sampled_from(TIERS), fallback=st.booleans())
    def restore(self, tier: str, fallback: bool) -> None:
        """A restarting job restores the latest checkpoint of one tier, under a lease: that
        tier's copies only, or (`fallback`) any other verified copy of a shard whose planned
        one cannot be read."""
        m, client = self.model, self.client()
        node = m.nodes[0] if tier == LOCAL else None
        latest = client.latest(m.job, tier=tier, node=node, lease_ttl=300, owner="sf-restore")
        sm = self.latest_step(latest)
        if latest is None or sm is None:
            m.count(f"restore {tier}: nothing restorable")
            return
        only = None if fallback else tier
        may_read = self.readable(sm, only, node, frozenset())
        what = f"restore {tier}" + (" (fallback)" if fallback else "")
        try:
            plan = dataclasses.replace(latest, tier=only)
            self.restored(
                sm,
                may_read,
                what,
                lambda dest: client.restore_checkpoint(plan, dest, node=node, tier=only),
            )
        finally:
            if latest.lease is not None:
                client.release_lease(m.job, latest.step, latest.lease.id)
        m.count(what)

    def plan_with_a_holder(
        self, tier: str
    ) -> tuple[str, LatestCheckpoint, StepModel, list[str]] | None:
        """The latest plan (under a lease) of `tier`, else of the other peer tier, that reads
        from a live node with a worker process of its own; with the tier, the step, and those
        nodes. Each plan not taken has its lease released."""
        m, client = self.model, self.client()
        for t in (tier, *(p for p in PEERS if p != tier)):
            latest = client.latest(m.job, tier=t, lease_ttl=300, owner="sf-restore")
            sm = self.latest_step(latest)
            if latest is None or sm is None:
                continue
            ours = sorted({e.node for e in latest.plan if e.node in m.holders} - m.lost_nodes)
            if ours:
                return t, latest, sm, ours
            if latest.lease is not None:
                client.release_lease(m.job, latest.step, latest.lease.id)
        return None

    @precondition(lambda self: self.model.steps)
    @rule(which=st.integers(0, 1), tier=st.sampled_from(PEERS))
    def restore_while_holder_dies(self, which: int, tier: str) -> None:
        """A job restores from the peer tier; once the restore is under way the worker of a
        node holding copies in its plan is killed (its data endpoint with it), and started
        again after the restore: the shards planned there are read from another copy."""
        m, stack, client = self.model, self.stack, self.client()
        # Nothing in flight: a worker killed mid-delete would hold that expiry for its
        # activity's whole timeout (30 minutes), and the settle with it.
        stack.wait_quiet(m.job, lambda: checks.busy_markers(self.engine, m))
        found = self.plan_with_a_holder(tier)
        if found is None:
            m.count("restore while a holder dies: no plan with a holder of its own")
            return
        tier, latest, sm, ours = found
        victim = ours[which % len(ours)]
        may_read = self.readable(sm, None, None, frozenset({victim}))
        killed: list[str] = []

        def kill(done: int = 0, total: int = 0) -> None:
            if not killed:
                killed.append(victim)
                stack.holders.kill(victim)

        if len(latest.plan) == 1:
            kill()  # its one read is the first: the holder dies before it
        plan = dataclasses.replace(latest, tier=None)
        try:
            self.restored(
                sm,
                may_read,
                f"restore {tier} while a holder dies",
                lambda dest: client.restore_checkpoint(plan, dest, workers=1, progress=kill),
            )
        finally:
            if killed:
                stack.holders.restart(victim)
            if latest.lease is not None:
                client.release_lease(m.job, latest.step, latest.lease.id)
        m.count(f"restore {tier} while a holder dies" + ("" if killed else " (read before)"))

    @precondition(lambda self: self.model.steps)
    @rule(tier=st.sampled_from((*PEERS, SHARED)), tighten=st.booleans())
    def restore_during_retention(self, tier: str, tighten: bool) -> None:
        """A job restores the latest step from one tier; once the restore is under way the job
        saves a newer step, it reaches that tier, and a retention run (under the tightest
        policy that keeps S3, with `tighten`) runs to its end: the copies the restore's lease
        holds stay, and the restore completes."""
        m, client = self.model, self.client()
        latest = client.latest(m.job, tier=tier, lease_ttl=300, owner="sf-restore")
        sm = self.latest_step(latest)
        if latest is None or sm is None or latest.lease is None:
            m.count(f"restore {tier} during retention: nothing restorable")
            return
        lease = latest.lease.id
        sm.leases.add(lease)
        self.protect(sm, "lease")
        may_read = self.readable(sm, tier, None, frozenset())
        raced: list[int] = []

        def race(done: int = 0, total: int = 0) -> None:
            if raced:
                return
            raced.append(self.newer_on(tier, tighten))
            self.stack.retention_pass(m.job, "stateful: retention during a restore")
            states = self.tier_states(sm.step)
            gone = {t: states.get(t) for t in sm.protected_tiers if states.get(t) in GONE}
            assert not gone, f"step {sm.step} expired under a restore's lease: {gone}"

        try:
            self.restored(
                sm,
                may_read,
                f"restore {tier} during retention",
                lambda dest: client.restore_checkpoint(latest, dest, workers=1, progress=race),
            )
        finally:
            client.release_lease(m.job, sm.step, lease)
            sm.leases.discard(lease)
            self.unprotect(sm)
        m.count(f"restore {tier} during retention")

    def newer_on(self, tier: str, tighten: bool) -> int:
        """A newer step registered (on the first writer) and waited for until its copy on
        `tier` is made or has failed; its step."""
        if tighten:
            self.revise_policy("p", "tight")
            self.assign_policy("p")
        self.register(["a.bin"], [512] * 3, [False] * 3, False, 0, False)
        step = self.model.next_step - 1
        deadline = time.monotonic() + SETTLE_TIMEOUT
        while self.tier_states(step).get(tier) in (None, "pending"):
            assert time.monotonic() < deadline, f"step {step} never reached {tier}"
            time.sleep(0.5)
        return step
