"""The stateful machine: the rules of rules_data and rules_ops in random interleavings, the
checks that hold at any moment after every step, and a rule that lets the job settle and then
checks everything (also run at the end of every example that has not failed)."""

from __future__ import annotations

import shutil
import sys
import time

from hypothesis.stateful import invariant, rule
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from tests.stateful import checks
from tests.stateful.model import LOCAL, SHARED
from tests.stateful.rules_data import DataRules
from tests.stateful.rules_ops import OpsRules


class StatefulMachine(DataRules, OpsRules):
    """One example: a fresh job (and its training token, its two policies) on the shared stack."""

    def __init__(self) -> None:
        super().__init__()
        self.create_policies()

    @invariant()
    def unregistered_files_kept(self) -> None:
        # Runs once after the machine is made and after every step.
        self.bump("steps")
        checks.check_unregistered(self.stack, self.engine, self.model)

    @invariant()
    def latest_offers_registered_bytes(self) -> None:
        if self.model.steps:
            checks.check_latest(self.stack, self.model, self.train, settled=False)

    @invariant()
    def known_good_latest_is_good(self) -> None:
        if self.model.steps:
            checks.check_known_good(self.stack, self.model, self.train)

    @rule()
    def settle(self) -> None:
        """Let every workflow of the job end (copies, repairs, verifications, one more
        retention pass), then check the whole job against the model."""
        self.settle_and_check()

    def settle_and_check(self) -> None:
        m = self.model
        if not m.steps:
            return
        started = time.monotonic()
        busy = lambda: checks.busy_markers(self.engine, m)  # noqa: E731
        self.stack.wait_quiet(m.job, busy)
        self.stack.retention_pass(m.job, "stateful: settle")
        self.stack.wait_quiet(m.job, busy)
        checks.forget_repaired(self.stack, self.engine, m)
        checks.check_settled(self.stack, self.engine, m)
        checks.check_unregistered(self.stack, self.engine, m)
        checks.check_latest(self.stack, m, self.train, settled=True)
        m.count("settle")
        self.bump("settles")
        self.bump("seconds settling", round(time.monotonic() - started))

    def teardown(self) -> None:
        # Hypothesis calls teardown in a `finally`: while a step's failure propagates, only clean
        # up, so that failure is the one reported and shrunk.
        failing = sys.exc_info()[0] is not None
        try:
            if not failing:
                self.settle_and_check()
        finally:
            for what, n in self.model.counts.items():
                self.bump(what, n)
            self.cleanup()

    def cleanup(self) -> None:
        """Leave nothing a later example could meet: workflows, rows, files, a lost node."""
        m, stack = self.model, self.stack
        stack.terminate_all(m.job)
        for attempt in range(20):
            # A worker's reconciler may be writing the job's rows: a deadlock is retried.
            try:
                with self.engine.begin() as conn:
                    conn.execute(text("DELETE FROM job WHERE name LIKE :p"), {"p": m.job + "%"})
                    conn.execute(
                        text("DELETE FROM retention_policy WHERE name LIKE :p"), {"p": m.job + "%"}
                    )
                    conn.execute(
                        text("UPDATE node SET lost_at = NULL WHERE id = ANY(:n)"),
                        {"n": list(m.nodes)},
                    )
                break
            except OperationalError:
                if attempt == 19:
                    raise
                time.sleep(0.5)
        for node in m.nodes:
            for job in (m.job, m.victim_job):
                shutil.rmtree(stack.step_dir(LOCAL, node, job, 0).parent, ignore_errors=True)
        shutil.rmtree(stack.step_dir(SHARED, None, m.job, 0).parent, ignore_errors=True)
        bucket = stack.s3_tier.bucket
        pages = stack.s3.get_paginator("list_objects_v2")
        for page in pages.paginate(Bucket=bucket, Prefix=f"{stack.s3_tier.prefix}{m.job}/"):
            for obj in page.get("Contents", []):
                stack.s3.delete_object(Bucket=bucket, Key=obj["Key"])
