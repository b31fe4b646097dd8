"""A stranger opens more connections to a node's data endpoint than the node worker process may
hold descriptors, and sends nothing on them: the endpoint keeps serving a reader with a
credential, and the process never runs out of descriptors.

A real `tierpoint worker --node` process serves the endpoint with its descriptor limit
(RLIMIT_NOFILE) set below the number of connections, as a small `ulimit -n` would; the
connections are real TCP connections that never send a byte. Before the endpoint bounded its
connections every one of them held a thread and a descriptor for ever, the process ran out of
descriptors ("Too many open files") and accepted nothing more, the reader included.

The header deadline is set far above the test's length, so only the bound on held connections
(and its eviction of connections waiting for a request) can let the reader in."""

from __future__ import annotations

import asyncio
import os
import socket
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import httpx
from sqlalchemy.orm import Session, sessionmaker

from tests.helpers.lifecycle import ShardSpec, crc_hex, seed_checkpoint
from tests.helpers.peer_faults import WORKER_SECRET, peer_settings, wait_for_endpoints
from tests.helpers.worker_process import worker_process
from tests.tierpoint.test_data_endpoint_reads import verified
from tierpoint.config import Settings

# Descriptors the worker process may hold: a Temporal client, a catalog pool, its listeners and
# a few files, and no room for the connections below.
OPEN_FILES = 200
CAP = 64
STRANGERS = 300
GUARD = 60.0  # hang guards, not timings
CONNECT = 5.0


def open_silently(host: str, port: int, n: int) -> list[socket.socket]:
    """Up to `n` connections, one after the other as the endpoint accepts them, none of which
    will ever send a byte; it stops at the first the endpoint does not take within CONNECT."""
    socks = []
    for _ in range(n):
        try:
            socks.append(socket.create_connection((host, port), timeout=CONNECT))
        except OSError:
            break
    return socks


async def test_connections_that_send_nothing_do_not_keep_a_reader_out(
    settings: Settings, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    node = f"n-{uuid.uuid4().hex[:8]}"
    cfg = peer_settings(
        settings,
        tmp_path,
        [node],
        data_max_connections=CAP,
        data_header_timeout=3600.0,
        data_idle_timeout=3600.0,
    )
    data = os.urandom(256 * 1024)
    job = f"strangers-{uuid.uuid4().hex[:8]}"
    shard = ShardSpec(node, "model.bin", data, crc_hex(data))
    cp = seed_checkpoint(cfg, sessions, job, 1, [shard])
    verified(sessions, cp.checkpoint_id, [shard.path], node=node)
    log = tmp_path / "worker.log"
    with worker_process(cfg, node, log, open_files_limit=OPEN_FILES) as worker:
        url = (await wait_for_endpoints(sessions, [node], GUARD))[node]
        where = urlsplit(url)
        assert where.hostname is not None and where.port is not None
        # More of them than the process could hold at once. Before the bound it ran out of
        # descriptors on the way and accepted nothing more, the reader below included.
        strangers = await asyncio.to_thread(open_silently, where.hostname, where.port, STRANGERS)
        try:
            assert len(strangers) == STRANGERS, f"the endpoint took {len(strangers)} of them"
            async with httpx.AsyncClient(timeout=GUARD) as http:
                r = await http.get(
                    f"{url}/v1/data/ssd/{job}/1/model.bin",
                    headers={"Authorization": f"Bearer {WORKER_SECRET}", "Range": "bytes=5-1004"},
                )
            assert r.status_code == 206, r.text
            assert r.content == data[5:1005]
            assert worker.alive(), worker.output()
        finally:
            for sock in strangers:
                sock.close()
    assert "Too many open files" not in log.read_text(errors="replace")
