"""A restore's reads from a node's data endpoint on a real catalog and real files: the client
keeps one connection per endpoint from file to file, the endpoint asks the catalog once per
checkpoint rather than once per file, and a listing it keeps never serves a file it does not
list: a stray file, and (once the listing is older than its TTL) a copy no longer verified, are
refused; a copy verified after the listing was made is served at once."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import event, insert, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker
from tierpoint_client.models import PlanEntry
from tierpoint_client.peer import PEERS
from tierpoint_client.restore import restore_plan

from tests.helpers.lifecycle import ShardSpec, crc_hex, seed_checkpoint, shard_file
from tierpoint.catalog.models import Replica, Shard
from tierpoint.config import Settings
from tierpoint.services.data_endpoint import DataServer, serve
from tierpoint.storage.base import ShardRef
from tierpoint.storage.peer_http import shard_url

NODE = "node-a"
SECRET = "tp_worker-credential-of-this-test"
FILES = 6


@pytest.fixture
def settings(catalog_settings: Settings) -> Settings:
    """The data endpoint serves files and reads the catalog: no Temporal, no S3."""
    return Settings.model_validate({**catalog_settings.model_dump(), "data_token": SECRET})


@pytest.fixture
def server(settings: Settings, sessions: sessionmaker[Session]) -> Iterator[DataServer]:
    srv = serve(settings, sessions, NODE, 0)
    yield srv
    srv.shutdown()
    srv.server_close()
    PEERS.close()


def verified(
    sessions: sessionmaker[Session], checkpoint_id: int, paths: list[str], node: str = NODE
) -> None:
    """Each file's copy on `node`'s local tier listed as verified, as the lifecycle leaves it."""
    with sessions.begin() as s:
        shards = s.execute(
            select(Shard.id, Shard.path).where(
                Shard.checkpoint_id == checkpoint_id, Shard.path.in_(paths)
            )
        ).all()
        s.execute(
            insert(Replica),
            [
                {
                    "shard_id": sh.id,
                    "checkpoint_id": checkpoint_id,
                    "tier": "ssd",
                    "node_id": node,
                    "state": "verified",
                    "location": sh.path,
                }
                for sh in shards
            ],
        )


def seeded(
    settings: Settings, sessions: sessionmaker[Session], files: int
) -> tuple[str, int, list[ShardSpec]]:
    job = f"reads-{uuid.uuid4().hex[:10]}"
    shards = []
    for i in range(files):
        data = bytes([i]) * (64 * 1024 + i)
        shards.append(ShardSpec(NODE, f"shard-{i}.bin", data, crc_hex(data)))
    cp = seed_checkpoint(settings, sessions, job, 1, shards)
    verified(sessions, cp.checkpoint_id, [sh.path for sh in shards])
    return job, cp.checkpoint_id, shards


def plan(server: DataServer, job: str, shards: list[ShardSpec]) -> list[PlanEntry]:
    entries = []
    for sh in shards:
        url = shard_url(server.url, "ssd", ShardRef(job, 1, sh.path))
        entries.append(
            PlanEntry(sh.path, len(sh.data), sh.crc32c, "ssd", "peer", NODE, url, url=url)
        )
    return entries


def test_a_restore_reads_every_file_over_one_connection_and_one_catalog_query(
    settings: Settings,
    sessions: sessionmaker[Session],
    engine: Engine,
    server: DataServer,
    tmp_path: Path,
) -> None:
    job, _, shards = seeded(settings, sessions, FILES)
    server.listings.ttl = 600.0  # the test's own pace must not expire the listing
    accepted: list[Any] = []
    accept = server.get_request

    def counted() -> Any:
        got = accept()
        accepted.append(got[1])
        return got

    server.get_request = counted  # type: ignore[method-assign]
    queries: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "replica" in statement:
            queries.append(statement)

    event.listen(engine, "before_cursor_execute", seen)
    try:
        dest = tmp_path / "restored"
        files = restore_plan(plan(server, job, shards), dest, {}, workers=1, token=SECRET).files
    finally:
        event.remove(engine, "before_cursor_execute", seen)
    assert [f.path for f in files] == [sh.path for sh in shards]
    for sh in shards:
        assert (dest / sh.path).read_bytes() == sh.data
    assert len(accepted) == 1, accepted
    assert len(queries) == 1, queries


def test_a_kept_listing_serves_nothing_it_does_not_list(
    settings: Settings, sessions: sessionmaker[Session], server: DataServer
) -> None:
    job, checkpoint_id, shards = seeded(settings, sessions, 3)
    first, second, _ = shards
    # On the disk, beside listed files, registered but with no verified copy yet.
    late = ShardSpec(NODE, "late.bin", b"late" * 100, crc_hex(b"late" * 100))
    stray = shard_file(settings, "ssd", NODE, job, 1, "stray.bin")
    stray.write_bytes(b"not registered")
    server.listings.ttl = 0.5
    auth = {"Authorization": f"Bearer {SECRET}"}

    def get(path: str) -> httpx.Response:
        return httpx.get(f"{server.url}/v1/data/ssd/{job}/1/{path}", headers=auth)

    r = get(first.path)
    assert r.status_code == 200 and r.content == first.data
    # The listing is fresh: a file it does not list is looked up, and refused.
    assert get("stray.bin").status_code == 404
    late_file = shard_file(settings, "ssd", NODE, job, 1, late.path)
    late_file.write_bytes(late.data)
    with sessions.begin() as s:
        s.execute(
            insert(Shard).values(
                checkpoint_id=checkpoint_id,
                ordinal=len(shards),
                path=late.path,
                size=len(late.data),
                checksum=late.crc32c,
                node_id=NODE,
            )
        )
    assert get(late.path).status_code == 404  # registered, not verified
    verified(sessions, checkpoint_id, [late.path])
    r = get(late.path)  # verified after the listing was made: served at once
    assert r.status_code == 200 and r.content == late.data
    # A copy that stops being verified is refused once the listing is older than its TTL.
    assert get(second.path).status_code == 200
    with sessions.begin() as s:
        s.execute(
            update(Replica)
            .where(Replica.checkpoint_id == checkpoint_id, Replica.location == second.path)
            .values(state="corrupt")
        )
    time.sleep(server.listings.ttl + 0.1)
    assert get(second.path).status_code == 404
    assert get(first.path).status_code == 200


def test_a_connection_the_endpoint_closed_when_idle_is_replaced_on_the_next_read(
    settings: Settings, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    settings = settings.model_copy(update={"data_idle_timeout": 0.2})
    server = serve(settings, sessions, NODE, 0)
    try:
        _reads_after_idle(settings, sessions, server, tmp_path)
    finally:
        server.shutdown()
        server.server_close()
        PEERS.close()


def _reads_after_idle(
    settings: Settings, sessions: sessionmaker[Session], server: DataServer, tmp_path: Path
) -> None:
    job, _, shards = seeded(settings, sessions, 2)
    first, second = plan(server, job, shards)
    restore_plan([first], tmp_path / "a", {}, workers=1, token=SECRET)
    time.sleep(0.6)  # the endpoint has closed the connection the client keeps
    files = restore_plan([second], tmp_path / "b", {}, workers=1, token=SECRET).files
    assert (tmp_path / "b" / second.path).read_bytes() == shards[1].data
    assert [f.tier for f in files] == ["ssd"]
