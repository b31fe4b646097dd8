"""`tierpoint node-lost NODE` against the real API, as an operator runs it."""

from __future__ import annotations

import asyncio
import os
import sys
import uuid

from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from tierpoint.catalog.nodes import upsert_node


async def _run(api_url: str, *args: str) -> tuple[int, str]:
    env = {**os.environ, "TIERPOINT_API_URL": api_url, "COLUMNS": "200", "NO_COLOR": "1"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tierpoint.cli.main",
        "node-lost",
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode()


async def test_node_lost_declares_once_then_reports_it_was_lost(
    api_url: str, catalog: Engine
) -> None:
    node = f"node-{uuid.uuid4().hex[:10]}"
    with Session(catalog) as s:
        upsert_node(s, node, {})
        s.commit()

    code, out = await _run(api_url, node, "--actor", "ops-bob")
    assert code == 0, out
    assert f"node {node} declared lost" in out
    code, out = await _run(api_url, node)
    assert code == 0, out
    assert f"node {node} was lost already" in out
    with catalog.connect() as conn:
        actors = conn.scalars(
            text(
                "SELECT actor FROM event WHERE kind = 'node_lost' AND detail->>'node' = :n "
                "AND checkpoint_id IS NULL"
            ),
            {"n": node},
        ).all()
    assert actors == ["ops-bob"]

    code, out = await _run(api_url, "never-reported-in")
    assert code == 1
    assert "node_not_found" in out
