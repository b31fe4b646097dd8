"""Rules of the stateful machine that are operator and job actions through the API: pins,
quarantines, leases, policies and their assignment, retention runs, verify, reconcile; and
requests a token's scope does not allow, which must change nothing."""

from __future__ import annotations

import time
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from tests.stateful.base import MachineBase
from tests.stateful.model import POLICIES, S3, TIERS, StepModel
from tests.stateful.stack import SETTLE_TIMEOUT, code
from tierpoint.temporal import request_retention

# (scope, action) pairs the scope table of docs/security.md refuses.
FORBIDDEN = (
    ("read", "pin"),
    ("train", "pin"),
    ("train", "unpin"),
    ("train", "lift"),
    ("read", "quarantine"),
    ("foreign", "quarantine"),
    ("foreign", "lease"),
    ("read", "lease"),
    ("none", "lease"),
    ("train", "assign"),
    ("operate", "assign"),
    ("operate", "revise"),
    ("train", "revise"),
    ("train", "node-lost"),
    ("read", "node-lost"),
    ("train", "reconcile"),
    ("read", "reconcile"),
    ("train", "verify"),
    ("foreign", "corrupt-report"),
    ("none", "corrupt-report"),
)


class OpsRules(MachineBase):
    def protect(self, sm: StepModel, what: str) -> None:
        """After a pin, lease or quarantine was granted: the tiers restorable now stay. A pin or
        a quarantine granted while a tier is already `expiring` would promise a copy whose
        deletion has begun, which the store refuses (409 `copy_expiring`). A lease promises only
        the copies restorable when it is granted, so a copy already expiring (one retention began
        before, or a lost node's failed copy) goes on expiring under it."""
        states = self.tier_states(sm.step)
        if what != "lease":
            expiring = sorted(t for t, s in states.items() if s == "expiring")
            assert not expiring, f"{what} of step {sm.step} granted while {expiring} being expired"
        sm.protected_tiers |= {t for t, s in states.items() if s == "restorable"}

    def unprotect(self, sm: StepModel) -> None:
        if not sm.protected:
            sm.protected_tiers.clear()

    @precondition(lambda self: self.model.steps)
    @rule(pick=st.integers(0, 63), on=st.booleans())
    def pin(self, pick: int, on: bool) -> None:
        sm = self.pick(pick)
        assert sm is not None
        before = self.fingerprint()
        r = self.call("PUT" if on else "DELETE", self.cp_path(sm.step, "/pin"), "operate")
        if r.status_code == 409:
            # Refused over an expiry in progress: nothing changed.
            assert on and code(r) == "copy_expiring", r.text
            assert self.fingerprint() == before, "a refused pin changed something"
            self.model.count("pin refused")
            return
        assert r.status_code == 200 and r.json()["pinned"] is on, r.text
        sm.pinned = on
        if on:
            self.protect(sm, "pin")
        else:
            self.unprotect(sm)
        self.model.count("pin" if on else "unpin")

    @precondition(lambda self: self.model.steps)
    @rule(
        pick=st.integers(0, 63),
        tier=st.none() | st.sampled_from(TIERS),
        scope=st.sampled_from(("operate", "train")),
    )
    def quarantine(self, pick: int, tier: str | None, scope: str) -> None:
        sm = self.pick(pick)
        assert sm is not None
        body = {"reason": f"stateful test ({scope})", "tier": tier}
        r = self.call("POST", self.cp_path(sm.step, "/quarantine"), scope, json=body)
        if r.status_code in (409, 404):
            # 409: the copy is being expired; 404: no copy on that tier (not meant for it).
            assert code(r) in ("copy_expiring", "tier_copy_not_found"), r.text
            self.model.count(f"quarantine refused: {code(r)}")
            return
        assert r.status_code == 200, r.text
        if tier is not None:
            sm.tier_quarantined.add(tier)
        elif scope == "operate":
            sm.quarantined = True
            self.protect(sm, "quarantine")
        else:
            # A training job's quarantine hides the checkpoint and keeps nothing from retention
            # (docs/retention.md): no protection.
            sm.train_quarantined = True
        self.model.count(f"quarantine by {scope}")

    @precondition(lambda self: self.model.steps)
    @rule(pick=st.integers(0, 63), verdict=st.sampled_from(("good", "suspect", "bad")))
    def verdict(self, pick: int, verdict: str) -> None:
        """The training loop's guard judges a checkpoint it loaded: bad is final and quarantines
        it as evidence; good and suspect only change what latest?health=good answers."""
        sm = self.pick(pick)
        assert sm is not None
        body = {"verdict": verdict, "metric": "loss", "value": "NaN" if verdict == "bad" else 1.0}
        before = self.fingerprint()
        r = self.call("PUT", self.cp_path(sm.step, "/verdict"), "train", json=body)
        if sm.verdict == "bad" and verdict != "bad":
            assert (r.status_code, code(r)) == (409, "verdict_conflict"), r.text
            assert self.fingerprint() == before, "a refused verdict changed something"
            self.model.count("verdict refused: bad is final")
            return
        assert r.status_code == 200, r.text
        assert r.json()["health"]["verdict"] == verdict, r.text
        if verdict == "bad" and sm.verdict != "bad":
            assert r.json()["quarantine_reason"].startswith("verdict bad"), r.text
            sm.quarantined = True
            self.protect(sm, "quarantine")
        sm.verdict = verdict
        self.model.count(f"verdict {verdict}")

    # Preconditions read only what the drawn steps decide (never an answer of the stack), so
    # Hypothesis can replay a failing sequence: "nothing held" is a no-op inside the rule.
    @precondition(lambda self: self.model.steps)
    @rule(pick=st.integers(0, 63), whole=st.booleans())
    def lift(self, pick: int, whole: bool) -> None:
        held = [
            s
            for s in self.model.registered()
            if s.quarantined or s.train_quarantined or s.tier_quarantined
        ]
        if not held:
            return
        sm = held[pick % len(held)]
        tier = None if whole or not sm.tier_quarantined else sorted(sm.tier_quarantined)[0]
        params = {"tier": tier} if tier else None
        r = self.call("DELETE", self.cp_path(sm.step, "/quarantine"), "operate", params=params)
        assert r.status_code == 200, r.text
        if tier is None:
            sm.quarantined = sm.train_quarantined = False
            self.unprotect(sm)
        else:
            sm.tier_quarantined.discard(tier)
        self.model.count("lift quarantine")

    @precondition(lambda self: self.model.steps)
    @rule(pick=st.integers(0, 63))
    def lease(self, pick: int) -> None:
        sm = self.pick(pick)
        assert sm is not None
        body = {"ttl_seconds": 3600, "holder": "sf-lease"}
        r = self.call("POST", self.cp_path(sm.step, "/leases"), "train", json=body)
        if r.status_code == 409:
            # Restorable from no tier: a lease holds the restorable copies, so it is refused
            # only when there are none (a copy being expired does not refuse it).
            assert code(r) == "not_leasable", r.text
            self.model.count(f"lease refused: {code(r)}")
            return
        assert r.status_code == 201, r.text
        sm.leases.add(int(r.json()["id"]))
        self.protect(sm, "lease")
        self.model.count("lease")

    @precondition(lambda self: self.model.steps)
    @rule(pick=st.integers(0, 63))
    def release(self, pick: int) -> None:
        held = [s for s in self.model.registered() if s.leases]
        if not held:
            return
        sm = held[pick % len(held)]
        lease_id = min(sm.leases)
        r = self.call("DELETE", self.cp_path(sm.step, f"/leases/{lease_id}"), "train")
        assert r.status_code == 204, r.text
        sm.leases.discard(lease_id)
        self.unprotect(sm)
        self.model.count("release")

    def in_force(self) -> None:
        """The model's policy is the document of the policy assigned to the job."""
        m = self.model
        m.policy = self.policies[self.assigned] if self.assigned else "keep-all"
        if m.policy_is_lossy():
            for sm in m.steps.values():
                sm.lossy = True

    @rule(which=st.sampled_from(("p", "q")), spec=st.sampled_from(sorted(POLICIES)))
    def revise_policy(self, which: str, spec: str) -> None:
        name = self.policy_name(which)
        r = self.call("PUT", f"/v1/policies/{name}", "admin", json={"spec": POLICIES[spec]})
        assert r.status_code == 200, r.text
        self.policies[name] = spec
        self.in_force()
        self.model.count("revise policy")

    @rule(which=st.sampled_from(("p", "q")))
    def assign_policy(self, which: str) -> None:
        name = self.policy_name(which)
        r = self.call("PUT", f"/v1/jobs/{self.model.job}/policy", "admin", json={"policy": name})
        if r.status_code == 404:
            # No checkpoint registered yet: the job does not exist.
            assert code(r) == "job_not_found", r.text
            return
        assert r.status_code == 200, r.text
        self.assigned = name
        self.in_force()
        self.model.count("assign policy")

    @rule()
    def retention_run(self) -> None:
        """What the periodic sweep does for every job: ask for a retention pass."""
        job = self.model.job
        self.stack.loop.retrying(lambda: request_retention(self.stack.temporal, job, "stateful"))
        self.model.count("retention run")

    @precondition(lambda self: self.model.steps)
    @rule(pick=st.integers(0, 63), tier=st.sampled_from(TIERS))
    def verify(self, pick: int, tier: str) -> None:
        sm = self.pick(pick)
        assert sm is not None
        r = self.call("POST", self.cp_path(sm.step, "/verify"), "operate", json={"tier": tier})
        if r.status_code == 409:
            assert code(r) == "nothing_to_verify", r.text
            return
        assert r.status_code == 202, r.text
        self.model.count(f"verify {tier}")

    @rule(repair=st.booleans(), tier=st.none() | st.sampled_from(TIERS))
    def reconcile(self, repair: bool, tier: str | None) -> None:
        body: dict[str, Any] = {"job": self.model.job, "repair": repair, "tier": tier}
        r = self.call("POST", "/v1/reconcile", "operate", json=body)
        if r.status_code == 404:
            assert code(r) == "job_not_found" and not self.model.steps, r.text
            return
        assert r.status_code == 202, r.text
        run = r.json()["id"]
        deadline = time.monotonic() + SETTLE_TIMEOUT
        while True:
            got = self.call("GET", f"/v1/reconcile/{run}", "read")
            assert got.status_code == 200, got.text
            if got.json()["status"] != "running":
                break
            assert time.monotonic() < deadline, f"reconciliation {run} never finished"
            time.sleep(0.5)
        assert got.json()["status"] == "completed", got.text
        self.model.count("reconcile" + (" with repair" if repair else ""))

    @rule(which=st.sampled_from(FORBIDDEN), pick=st.integers(0, 63), malformed=st.booleans())
    def forbidden(self, which: tuple[str, str], pick: int, malformed: bool) -> None:
        """A token whose scope does not allow the action: 401/403, and nothing changes."""
        scope, action = which
        sm = self.pick(pick)
        step = sm.step if sm else 1
        m = self.model
        routes: dict[str, tuple[str, str, Any]] = {
            "pin": ("PUT", self.cp_path(step, "/pin"), None),
            "unpin": ("DELETE", self.cp_path(step, "/pin"), None),
            "lift": ("DELETE", self.cp_path(step, "/quarantine"), None),
            "quarantine": ("POST", self.cp_path(step, "/quarantine"), {"reason": "not yours"}),
            "lease": ("POST", self.cp_path(step, "/leases"), {"ttl_seconds": 60}),
            "assign": ("PUT", f"/v1/jobs/{m.job}/policy", {"policy": self.policy_name("q")}),
            "revise": (
                "PUT",
                f"/v1/policies/{self.policy_name('p')}",
                {"spec": POLICIES["durable-1"]},
            ),
            "node-lost": ("POST", f"/v1/nodes/{m.nodes[0]}/lost", None),
            "reconcile": ("POST", "/v1/reconcile", {"job": m.job, "repair": True}),
            "verify": ("POST", self.cp_path(step, "/verify"), {"tier": S3}),
            "corrupt-report": (
                "POST",
                self.cp_path(step, "/corrupt-copies"),
                {"tier": S3, "path": "a.bin", "reason": "not yours"},
            ),
        }
        method, path, body = routes[action]
        before = self.fingerprint()
        if malformed and body is not None:
            r = self.call(method, path, scope, content=b"{bad")
        else:
            r = self.call(method, path, scope, json=body)
        want = 401 if scope == "none" else 403
        assert r.status_code == want, f"{scope} {action}: {r.status_code} {r.text}"
        assert self.fingerprint() == before, f"{scope} {action} changed something"
        self.model.count("forbidden refused")

    @precondition(lambda self: self.model.steps)
    @rule(pick=st.integers(0, 63), field=st.sampled_from(("path", "reason")))
    def nul_report(self, pick: int, field: str) -> None:
        sm = self.pick(pick)
        assert sm is not None
        body = {"tier": S3, "path": next(iter(sm.shards)), "reason": "bad copy"}
        body[field] = body[field] + "\u0000"
        before = self.fingerprint()
        r = self.call("POST", self.cp_path(sm.step, "/corrupt-copies"), "train", json=body)
        assert r.status_code == 422, r.text
        assert self.fingerprint() == before
