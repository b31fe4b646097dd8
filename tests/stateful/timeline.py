"""The stateful machine of a run's timeline (docs/timeline.md): random interleavings of saves on
the job's current branch, rollbacks to valid targets and to every kind of invalid one (a step
never saved, one after the timeline's newest, a superseded one, one with a bad verdict), saves
of the steps a rollback superseded (re-saved steps), verdicts, a fork of a child job from one of
the job's checkpoints, the child's own saves, and retention runs of the job under a policy that
keeps only the newest checkpoint anywhere, S3 included, so that only the timeline's
protections keep anything else. On the stateful test's real stack (stack.py), through the API.

The model (`Timeline`) is the test's own: what each save wrote, which checkpoints a rollback
superseded, the verdicts, the fork. After every step:

- `latest` (any job) never answers a superseded or bad checkpoint, nor one the model lacks, and
  `latest?health=good` answers only a good one on the timeline;
- the tiers on which the job's newest good checkpoint was restorable when it was judged never
  expire while it is the newest good one;
- the tiers on which the fork's parent checkpoint was restorable at the fork never expire until
  the child has a restorable checkpoint of its own;
- a re-saved step never shares a location with the checkpoint it supersedes, and every replica
  the catalog calls verified holds the bytes that checkpoint's save wrote (checked at every
  settle and at the end of the example)."""

from __future__ import annotations

import os
import shutil
import sys
import time
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, precondition, rule
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from tests.stateful.base import MachineBase
from tests.stateful.model import LOCAL, ON_NODES, SHARED, crc_hex
from tests.stateful.stack import code
from tests.stateful.timeline_model import GONE, NEWEST_ONLY, Saved, Timeline


class TimelineMachine(MachineBase):
    def __init__(self) -> None:
        super().__init__()
        self.tl = Timeline(job=self.model.job)
        self.create_policies()

    # -- helpers ------------------------------------------------------------------------------

    def cp(self, s: Saved, shards: bool = False) -> dict[str, Any]:
        r = self.call(
            "GET",
            f"/v1/jobs/{s.job}/checkpoints/{s.step}",
            "admin",
            params={"branch": s.branch, "shards": shards},
        )
        assert r.status_code == 200, r.text
        body: dict[str, Any] = r.json()
        return body

    def states(self, s: Saved) -> dict[str, str]:
        return {t["tier"]: t["state"] for t in self.cp(s)["tiers"]}

    def restorable_settled(self, s: Saved) -> bool:
        """Whether the checkpoint is restorable once the jobs' workflows have settled (its seal
        takes a moment; retention under NEWEST_ONLY may have expired it everywhere, which makes
        it a target the store must refuse)."""
        for job in (self.tl.job, self.tl.child):
            self.stack.wait_quiet(job, lambda: [])
        return "restorable" in self.states(s).values()

    def save(self, job: str, step: int) -> Saved:
        branch = self.tl.branch.get(job, 1)
        s = Saved(job, step, branch, {f"w{i}.bin": os.urandom(4096 + i) for i in range(2)})
        node = self.model.writers[0]
        for path, data in s.files.items():
            f = self.stack.settings.tier(LOCAL).root_for(node) / job / s.where / path
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_bytes(data)
        shards = [
            {"path": p, "size": len(d), "crc32c": crc_hex(d), "node": node}
            for p, d in s.files.items()
        ]
        body = {"step": step, "branch": branch, "shards": shards}
        r = self.call("POST", f"/v1/jobs/{job}/checkpoints", "train", json=body)
        assert r.status_code == 201, r.text
        self.tl.saved.append(s)
        self.tl.branch.setdefault(job, 1)
        self.tl.changed = True
        return s

    def refused_changes_nothing(self, step: int, want: str) -> None:
        before = self.branches()
        r = self.call("POST", f"/v1/jobs/{self.tl.job}/rollback", "train", json={"step": step})
        assert r.status_code in (404, 409, 422) and code(r) == want, r.text
        assert self.branches() == before, "a refused rollback changed the timeline"
        self.model.count(f"rollback refused: {want}")

    def branches(self) -> tuple[Any, ...]:
        with self.engine.connect() as conn:
            return tuple(
                conn.execute(
                    text(
                        "SELECT j.current_branch, c.step, c.branch, c.superseded_by "
                        "FROM job j JOIN checkpoint c ON c.job_id = j.id "
                        "WHERE j.name = :job ORDER BY 2, 3"
                    ),
                    {"job": self.tl.job},
                ).all()
            )

    # -- rules --------------------------------------------------------------------------------

    @initialize(n=st.integers(2, 3), rolled=st.sampled_from((True, False)), pick=st.integers(0, 63))
    def first_saves(self, n: int, rolled: bool, pick: int) -> None:
        """A run that has saved a few checkpoints and, mostly, rolled back once: every rule has
        something to act on (the first examples Hypothesis tries are short ones, which seldom
        reached a rollback by themselves)."""
        for i in range(n):
            self.save(self.tl.job, (i + 1) * 10)
        self.model.count("timeline save")
        if rolled:
            self.rollback(pick)

    @rule(gap=st.integers(1, 3))
    def save_next(self, gap: int) -> None:
        line = self.tl.timeline(self.tl.job)
        self.save(self.tl.job, (line[-1].step if line else 0) + gap * 10)
        self.model.count("timeline save")

    def healthy(self) -> list[Saved]:
        return [s for s in self.tl.timeline(self.tl.job) if s.verdict != "bad"]

    def targets(self) -> list[Saved]:
        """Valid rollback targets: on the timeline, not bad, not its newest."""
        line = self.tl.timeline(self.tl.job)
        return [s for s in line[:-1] if s.verdict != "bad"]

    @precondition(lambda self: self.targets())
    @rule(pick=st.integers(0, 63))
    def rollback(self, pick: int) -> None:
        line = self.tl.timeline(self.tl.job)
        choices = self.targets()
        target = choices[pick % len(choices)]
        if not self.restorable_settled(target):
            self.refused_changes_nothing(target.step, "not_restorable")
            return
        r = self.call(
            "POST",
            f"/v1/jobs/{self.tl.job}/rollback",
            "train",
            json={"step": target.step, "reason": "stateful"},
        )
        assert r.status_code == 201, r.text
        after = [s for s in line if s.step > target.step]
        assert r.json()["superseded"] == [s.step for s in after], r.text
        for s in after:
            s.superseded = True
        self.tl.branch[self.tl.job] = r.json()["branch"]["number"]
        self.tl.branch_from = target.step
        self.tl.changed = True
        self.model.count("rollback")

    def refusals(self) -> list[tuple[int, str]]:
        """(step, code) of every invalid rollback target the job has now."""
        line = self.tl.timeline(self.tl.job)
        out = [(line[-1].step + 1, "rollback_to_future")]
        if len(line) >= 2:  # every step saved is a multiple of 10
            out.append((line[0].step + 1, "checkpoint_not_found"))
        on_line = {x.step for x in line}
        out += [
            (s.step, "checkpoint_superseded")
            for s in self.tl.saved
            if s.job == self.tl.job and s.superseded and s.step not in on_line
        ]
        # (not the current branch's start: that again is a retry of its rollback while the
        # branch holds nothing after it)
        out += [
            (s.step, "not_restorable")
            for s in line
            if s.verdict == "bad" and s.step != self.tl.branch_from
        ]
        return out

    @precondition(lambda self: self.tl.timeline(self.tl.job))
    @rule(pick=st.integers(0, 63))
    def rollback_refused(self, pick: int) -> None:
        choices = self.refusals()
        step, want = choices[pick % len(choices)]
        self.refused_changes_nothing(step, want)

    def resavable(self) -> list[int]:
        """Steps a rollback superseded that the run, training on, saves next."""
        line = self.tl.timeline(self.tl.job)
        return sorted(
            s.step
            for s in self.tl.saved
            if s.job == self.tl.job and s.superseded and s.step > line[-1].step
        )

    @precondition(lambda self: self.resavable())
    @rule()
    def save_again(self) -> None:
        """The run trains on from the branch point: the next step it saves is one the rollback
        superseded, now on the new branch (its own directory on every tier)."""
        self.save(self.tl.job, self.resavable()[0])
        self.model.count("timeline save again")

    @precondition(lambda self: self.healthy())
    @rule(pick=st.integers(0, 63), verdict=st.sampled_from(("good", "good", "bad")))
    def verdict(self, pick: int, verdict: str) -> None:
        line = self.healthy()
        s = line[pick % len(line)]
        body = {"verdict": verdict, "metric": "loss", "value": 1.0}
        r = self.call(
            "PUT",
            f"/v1/jobs/{s.job}/checkpoints/{s.step}/verdict",
            "train",
            json=body,
            params={"branch": s.branch},
        )
        assert r.status_code == 200, r.text
        s.verdict = verdict
        self.tl.changed = True
        if verdict == "good" and s is self.tl.newest_good():
            s.kept_tiers = {t for t, st_ in self.states(s).items() if st_ == "restorable"}
        self.model.count(f"verdict {verdict}")

    @precondition(lambda self: self.tl.fork_parent is None and self.healthy())
    @rule(pick=st.integers(0, 63))
    def fork(self, pick: int) -> None:
        line = self.healthy()
        parent = line[pick % len(line)]
        restorable = self.restorable_settled(parent)
        body = {"parent": {"job": parent.job, "step": parent.step, "branch": parent.branch}}
        r = self.call("POST", f"/v1/jobs/{self.tl.child}/fork", "train", json=body)
        if not restorable:
            # Retention expired it everywhere: nothing for a child to start from.
            assert (r.status_code, code(r)) == (409, "not_restorable"), r.text
            self.model.count("fork refused: not_restorable")
            return
        assert r.status_code == 201, r.text
        self.tl.fork_parent = parent
        self.tl.changed = True
        parent.kept_tiers |= {t for t, s in self.states(parent).items() if s == "restorable"}
        self.model.count("fork")

    @precondition(lambda self: self.tl.fork_parent is not None)
    @rule()
    def child_saves(self) -> None:
        own = self.tl.timeline(self.tl.child)
        self.save(self.tl.child, (own[-1].step if own else 0) + 10)
        self.model.count("child save")

    @precondition(lambda self: self.tl.timeline(self.tl.job))
    @precondition(lambda self: self.tl.changed)
    @rule()
    def retention(self) -> None:
        """The job's retention under NEWEST_ONLY, run to its end (once something changed since
        the last run: another run at once would find nothing new to do)."""
        self.tl.changed = False
        name = self.policy_name("p")
        if self.policies.get(name) != "newest-only":
            r = self.call("PUT", f"/v1/policies/{name}", "admin", json={"spec": NEWEST_ONLY})
            assert r.status_code == 200, r.text
            self.policies[name] = "newest-only"
            r = self.call("PUT", f"/v1/jobs/{self.tl.job}/policy", "admin", json={"policy": name})
            assert r.status_code == 200, r.text
        self.stack.retention_pass(self.tl.job, "stateful timeline")
        self.model.count("timeline retention")

    @rule()
    def settle(self) -> None:
        self.settle_and_check()

    # -- invariants ---------------------------------------------------------------------------

    @invariant()
    def latest_is_on_the_timeline_and_not_bad(self) -> None:
        self.bump("steps")
        for job in (self.tl.job, self.tl.child):
            r = self.call("GET", f"/v1/jobs/{job}/checkpoints/latest", "train")
            if r.status_code == 404:
                continue
            assert r.status_code == 200, r.text
            got = r.json()
            c = got["checkpoint"]
            s = self.tl.of(c["job"], got["step"], c["branch"])
            assert s is not None, f"latest of {job} answered a checkpoint never saved: {got}"
            assert s.verdict != "bad", f"latest of {job}: {s}"
            if got.get("fork_parent"):
                # The checkpoint the fork named (its job, step and branch), even if a rollback
                # of its own job superseded it since: the child's timeline starts there.
                assert job == self.tl.child and s is self.tl.fork_parent, got
            else:
                assert not s.superseded, f"latest of {job}: {s}"
            self.bump("check: latest on the timeline")
        r = self.call(
            "GET", f"/v1/jobs/{self.tl.job}/checkpoints/latest", "train", params={"health": "good"}
        )
        if r.status_code == 200:
            got = r.json()
            s = self.tl.of(self.tl.job, got["step"], got["checkpoint"]["branch"])
            assert s is not None and s.verdict == "good" and not s.superseded, got
            self.bump("check: known-good latest")

    @invariant()
    def protected_copies_kept(self) -> None:
        good = self.tl.newest_good()
        kept: list[tuple[Saved, str]] = [(good, "newest good")] if good else []
        parent = self.tl.fork_parent
        if parent is not None and not self.child_has_its_own():
            kept.append((parent, "fork parent"))
        for s, why in kept:
            states = self.states(s)
            gone = {t: states[t] for t in s.kept_tiers if states.get(t) in GONE}
            assert not gone, f"the {why} {s.job}:{s.step}@{s.branch} lost {gone}"
            self.bump("check: timeline protection")

    def child_has_its_own(self) -> bool:
        return any("restorable" in self.states(s).values() for s in self.tl.timeline(self.tl.child))

    # -- settle and clean up ------------------------------------------------------------------

    def settle_and_check(self) -> None:
        for job in (self.tl.job, self.tl.child):
            self.stack.wait_quiet(job, lambda: [])
        self.check_files()

    def check_files(self) -> None:
        """No two checkpoints of a job share a location; every verified replica holds what its
        checkpoint's save wrote."""
        seen: dict[str, Saved] = {}
        for s in self.tl.saved:
            for shard in self.cp(s, shards=True)["shards"]:
                for rep in shard["replicas"]:
                    if rep["state"] != "verified":
                        continue
                    where = rep["location"]
                    other = seen.setdefault(where, s)
                    assert other is s, f"{s} and {other} share {where}"
                    data = self.stack.read_location(where)
                    assert data == s.files[shard["path"]], f"{s}: {where} lost its bytes"
                    self.bump("check: verified bytes of the timeline")

    def teardown(self) -> None:
        try:
            if sys.exc_info()[0] is None:
                self.settle_and_check()
        finally:
            for what, n in self.model.counts.items():
                self.bump(what, n)
            self.cleanup()

    def cleanup(self) -> None:
        for job in (self.tl.job, self.tl.child):
            self.stack.terminate_all(job)
        for attempt in range(20):
            # An activity of a terminated workflow may still be writing the job's rows: a
            # deadlock with it is retried, as the main machine's cleanup does.
            try:
                with self.engine.begin() as conn:
                    p = {"p": self.tl.job + "%"}
                    conn.execute(text("DELETE FROM job WHERE name LIKE :p"), p)
                    conn.execute(text("DELETE FROM retention_policy WHERE name LIKE :p"), p)
                break
            except OperationalError:
                if attempt == 19:
                    raise
                time.sleep(0.5)
        for job in (self.tl.job, self.tl.child):
            for node in self.model.nodes:
                for tier in ON_NODES:
                    root = self.stack.settings.tier(tier).root_for(node) / job
                    shutil.rmtree(root, ignore_errors=True)
            shutil.rmtree(self.stack.settings.tier(SHARED).root_for(None) / job, True)
            bucket, prefix = self.stack.s3_tier.bucket, f"{self.stack.s3_tier.prefix}{job}/"
            pages = self.stack.s3.get_paginator("list_objects_v2")
            for page in pages.paginate(Bucket=bucket, Prefix=prefix):
                for obj in page.get("Contents", []):
                    self.stack.s3.delete_object(Bucket=bucket, Key=obj["Key"])
