"""The catalog fixtures as a test meets them (pytest run on probe tests with the suite's own
conftest): what a test commits through `session` is rolled back at its end, seen by no other
connection meanwhile and by no later test; what it commits on `migrated_url` really commits."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.probes import outcomes, run_pytest, write_probe

PROBES = """
from sqlalchemy import text
from sqlalchemy.orm import Session

from tierpoint.catalog.engine import make_sync_engine

JOB = "probe-job-committed-in-a-test"
COUNT = text("SELECT count(*) FROM job WHERE name = :name").bindparams(name=JOB)


def test_commits_through_session(session: Session, rollback_catalog) -> None:
    session.execute(text("INSERT INTO job (name) VALUES (:name)"), {"name": JOB})
    session.commit()  # as code under test does: a savepoint's commit, inside the test's transaction
    assert session.scalar(COUNT) == 1
    with rollback_catalog.connect() as other:
        assert other.scalar(COUNT) == 0


def test_a_later_test_does_not_see_it(session: Session) -> None:
    assert session.scalar(COUNT) == 0


def test_commits_on_its_modules_catalog(migrated_url: str) -> None:
    engine = make_sync_engine(migrated_url, pool_size=1)
    try:
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO job (name) VALUES (:name)"), {"name": JOB})
        with engine.connect() as other:
            assert other.scalar(COUNT) == 1
    finally:
        engine.dispose()
"""


@pytest.mark.full_stack  # runs pytest as a process
def test_a_tests_commits_through_session_are_rolled_back_and_seen_by_no_one_else(
    tmp_path: Path,
) -> None:
    probe, out = write_probe(tmp_path, PROBES)
    ran = run_pytest(probe, out, "-p", "no:randomly", "-rA")
    assert outcomes(ran.stdout) == {
        "test_commits_through_session": "PASSED",
        "test_a_later_test_does_not_see_it": "PASSED",
        "test_commits_on_its_modules_catalog": "PASSED",
    }, ran.stdout + ran.stderr
