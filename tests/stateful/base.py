"""What every rule of the stateful machine shares: the stack of the run, this example's job and
model, its tokens, and reading a checkpoint's state through the API as an operator would."""

from __future__ import annotations

import uuid
from typing import Any, ClassVar

from hypothesis.stateful import RuleBasedStateMachine
from sqlalchemy import Engine, text

from tests.helpers.tokens import create_token
from tests.stateful.model import POLICIES, TIERS, Model, StepModel
from tests.stateful.stack import Stack


class MachineBase(RuleBasedStateMachine):
    # Set once per run by the test (the machine is built by Hypothesis without arguments).
    stack: ClassVar[Stack]
    engine: ClassVar[Engine]
    # Tokens that outlive an example: a training token of jobs nobody here runs.
    foreign_token: ClassVar[str]
    # Totals over the whole run (examples, steps, checks), reported at the end.
    totals: ClassVar[dict[str, int]] = {}

    def __init__(self) -> None:
        super().__init__()
        job = f"sf-{uuid.uuid4().hex[:10]}"
        self.model = Model(job=job, nodes=self.stack.nodes)
        self.train = create_token(self.engine, f"sf-train-{job}", [f"train:{job}"])
        # The two policies an example switches between, revises and assigns.
        self.policies: dict[str, str] = {}  # policy name -> the POLICIES entry it holds now
        self.assigned: str | None = None
        self.bump("examples")

    # -- bookkeeping --------------------------------------------------------------------------

    @classmethod
    def bump(cls, what: str, n: int = 1) -> None:
        cls.totals[what] = cls.totals.get(what, 0) + n

    def token(self, scope: str) -> str | None:
        if scope == "train":
            return self.train
        if scope == "foreign":
            return self.foreign_token
        if scope == "none":
            return None
        return self.stack.tokens[scope]

    def call(self, method: str, path: str, scope: str, **kwargs: Any) -> Any:
        return self.stack.api.call(method, path, self.token(scope), **kwargs)

    def cp_path(self, step: int, rest: str = "") -> str:
        return f"/v1/jobs/{self.model.job}/checkpoints/{step}{rest}"

    def pick(self, index: int) -> StepModel | None:
        steps = self.model.registered()
        return steps[index % len(steps)] if steps else None

    # -- the store's view ---------------------------------------------------------------------

    def checkpoint(self, step: int) -> dict[str, Any] | None:
        r = self.call("GET", self.cp_path(step), "admin")
        if r.status_code == 404:
            return None
        assert r.status_code == 200, r.text
        body: dict[str, Any] = r.json()
        return body

    def tier_states(self, step: int) -> dict[str, str]:
        cp = self.checkpoint(step)
        return {t["tier"]: t["state"] for t in cp["tiers"]} if cp else {}

    def verified_on(self, cp: dict[str, Any], tier: str) -> dict[str, str]:
        """path -> location of the shards with a verified replica on `tier`."""
        out = {}
        for s in cp["shards"]:
            for r in s["replicas"]:
                if r["tier"] == tier and r["state"] == "verified":
                    out[s["path"]] = r["location"]
        return out

    def whole_tiers(self, cp: dict[str, Any], sm: StepModel, but: str | None = None) -> list[str]:
        """Restorable tiers other than `but`, every shard verified there and undamaged."""
        out = []
        states = {t["tier"]: t["state"] for t in cp["tiers"]}
        for tier in TIERS:
            if tier == but or states.get(tier) != "restorable":
                continue
            have = set(self.verified_on(cp, tier)) - {p for t, p in sm.damage if t == tier}
            if have == set(sm.shards):
                out.append(tier)
        return out

    def fingerprint(self) -> dict[str, Any]:
        """What no refused request may change: pins, quarantines, active leases, the job's
        policy, the policies' documents, lost nodes."""
        with self.engine.connect() as conn:
            cps = conn.execute(
                text(
                    "SELECT c.step, c.pinned, c.quarantine_reason, c.metadata FROM checkpoint c "
                    "JOIN job j ON j.id = c.job_id WHERE j.name = :job ORDER BY c.step"
                ),
                {"job": self.model.job},
            ).all()
            tiers = conn.execute(
                text(
                    "SELECT ct.step, ct.tier, ct.quarantine_reason FROM checkpoint_tier ct "
                    "JOIN job j ON j.id = ct.job_id WHERE j.name = :job ORDER BY 1, 2"
                ),
                {"job": self.model.job},
            ).all()
            leases = conn.execute(
                text(
                    "SELECT l.id FROM restore_lease l JOIN checkpoint c ON c.id = l.checkpoint_id "
                    "JOIN job j ON j.id = c.job_id WHERE j.name = :job AND l.released_at IS NULL "
                    "ORDER BY 1"
                ),
                {"job": self.model.job},
            ).all()
            job = conn.execute(
                text("SELECT j.policy_id FROM job j WHERE j.name = :job"),
                {"job": self.model.job},
            ).all()
            policies = conn.execute(
                text("SELECT name, version FROM retention_policy WHERE name LIKE :p ORDER BY 1"),
                {"p": self.model.job + "%"},
            ).all()
            nodes = conn.execute(
                text("SELECT id, lost_at FROM node WHERE id = ANY(:n) ORDER BY 1"),
                {"n": list(self.model.nodes)},
            ).all()
        return {
            "checkpoints": [tuple(r) for r in cps],
            "tiers": [tuple(r) for r in tiers],
            "leases": [tuple(r) for r in leases],
            "job": [tuple(r) for r in job],
            "policies": [tuple(r) for r in policies],
            "nodes": [tuple(r) for r in nodes],
        }

    def policy_name(self, which: str) -> str:
        return f"{self.model.job}-{which}"

    def create_policies(self) -> None:
        for which in ("p", "q"):
            name = self.policy_name(which)
            r = self.call(
                "POST", "/v1/policies", "admin", json={"name": name, "spec": POLICIES["keep-all"]}
            )
            assert r.status_code == 201, r.text
            self.policies[name] = "keep-all"
