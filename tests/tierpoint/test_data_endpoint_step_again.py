"""A step deleted and registered again while a node's data endpoint still keeps the old
checkpoint's listing: the new copy, of another size, is served, and nothing is marked damaged.

It was not (found by the stateful test): the listing answers a checkpoint's reads by (tier, job,
step) for `LISTING_TTL` seconds, so the first read of the new copy (its lifecycle's peer copy,
within a second of the old one's) found a file "holding 270 of its 269 registered bytes", marked
the new checkpoint's verified copy corrupt and demoted its tier: its only copy, so every later
tier failed and the checkpoint was lost for nothing. Only the catalog's size of now condemns a
copy: a file that does not match a kept listing is looked up again first.

By construction, not timing: the listing is kept for the whole test (its TTL set long)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import pytest
from sqlalchemy import delete, insert, select
from sqlalchemy.orm import Session, sessionmaker

from tests.helpers.lifecycle import ShardSpec, crc_hex, seed_checkpoint
from tierpoint.catalog.models import Checkpoint, Replica, Shard
from tierpoint.config import Settings
from tierpoint.services.data_endpoint import DataServer, serve
from tierpoint.storage.base import ShardRef
from tierpoint.storage.peer_http import shard_url

NODE = "node-a"
SECRET = "tp_worker-credential-of-this-test"
STEP = 1
PATH = "amp&k=v.bin"


@pytest.fixture
def settings(catalog_settings: Settings) -> Settings:
    """The data endpoint serves files and reads the catalog: no Temporal, no S3."""
    return Settings.model_validate({**catalog_settings.model_dump(), "data_token": SECRET})


@pytest.fixture
def server(settings: Settings, sessions: sessionmaker[Session]) -> Iterator[DataServer]:
    srv = serve(settings, sessions, NODE, 0)
    srv.listings.ttl = 3600.0  # kept for the whole test
    yield srv
    srv.shutdown()
    srv.server_close()


def register(settings: Settings, sessions: sessionmaker[Session], job: str, data: bytes) -> int:
    """The step registered with `data` as its one shard, its file written and sealed (verified on
    the node's local tier), as the lifecycle leaves it."""
    cp = seed_checkpoint(
        settings, sessions, job, STEP, [ShardSpec(NODE, PATH, data, crc_hex(data))]
    )
    with sessions.begin() as s:
        shard = s.scalars(select(Shard.id).where(Shard.checkpoint_id == cp.checkpoint_id)).one()
        s.execute(
            insert(Replica).values(
                shard_id=shard,
                checkpoint_id=cp.checkpoint_id,
                tier="ssd",
                node_id=NODE,
                state="verified",
                location=PATH,
            )
        )
    return cp.checkpoint_id


def states(sessions: sessionmaker[Session], checkpoint_id: int) -> list[str]:
    with sessions() as s:
        return list(s.scalars(select(Replica.state).where(Replica.checkpoint_id == checkpoint_id)))


def test_a_step_registered_again_is_served_with_its_new_size(
    settings: Settings, sessions: sessionmaker[Session], server: DataServer
) -> None:
    job = f"again-{uuid.uuid4().hex[:10]}"
    old = register(settings, sessions, job, b"o" * 269)
    url = shard_url(server.url, "ssd", ShardRef(job, STEP, PATH))
    headers = {"Authorization": f"Bearer {SECRET}"}
    assert httpx.get(url, headers=headers).content == b"o" * 269

    # Deleted (every copy expired, the row gone) and registered again, one byte longer.
    with sessions.begin() as s:
        s.execute(delete(Checkpoint).where(Checkpoint.id == old))
    new = register(settings, sessions, job, b"n" * 270)

    r = httpx.get(url, headers=headers)
    assert r.status_code == 200, r.text
    assert r.content == b"n" * 270
    assert states(sessions, new) == ["verified"]
