"""A node's data endpoint serves the stripes its encoder staged for a coded tier's holders, on a
real catalog, real files and a real HTTP server: a stripe the catalog places there is served
whole or by range to a credential, byte for byte what the encoder recorded; no credential is
401; a stripe index the code has not, a stray file in the staging area, a stripe of a shard the
catalog never placed and one whose copy is being expired are 404, whatever lies on disk. A
holder serves the stripe it holds to a restore only while the catalog has it verified there and
the holder is not declared lost."""

from __future__ import annotations

import httpx
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from tests.helpers.coded_tier import (
    CODE,
    SECRET,
    STEP,
    coded,
    encode,
    holders_a,
    pull,
    ready,
    sealed,
    server,
    staged_file,
)
from tests.helpers.lifecycle import crc_hex
from tierpoint.catalog.models import Shard, Stripe
from tierpoint.catalog.stripe import machine as stripes
from tierpoint.catalog.tier_copy.node_lost import mark_lost
from tierpoint.config import Settings
from tierpoint.services.data_endpoint import DataServer, serve
from tierpoint.storage.base import ShardRef
from tierpoint.storage.peer_http import stripe_url

# Imported fixtures: the coded tier and node-a's data endpoint.
__all__ = ["coded", "server"]

AUTH = {"Authorization": f"Bearer {SECRET}"}
GUARD = 30.0  # against a hang, not a performance assertion


def test_staged_stripes_are_served_to_their_holders_as_the_catalog_places_them(
    coded: Settings, sessions: sessionmaker[Session], server: DataServer
) -> None:
    cp, job, shards = sealed(coded, sessions, 300_000)
    assert encode(coded, sessions, cp, job).verified == 3
    with sessions() as s:
        recorded = {
            (r.path, r.stripe_index): (r.size, r.crc32c)
            for r in s.execute(
                select(Shard.path, Stripe.stripe_index, Stripe.size, Stripe.crc32c)
                .join(Shard, Shard.id == Stripe.shard_id)
                .where(Stripe.checkpoint_id == cp)
            )
        }
    base = server.url

    def url(index: int, path: str) -> str:
        return stripe_url(base, "coded", index, ShardRef(job, STEP, path))

    for sh in shards:
        for i in range(CODE.width):
            r = httpx.get(url(i, sh.path), headers=AUTH, timeout=GUARD)
            assert r.status_code == 200, r.text
            assert (len(r.content), crc_hex(r.content)) == recorded[(sh.path, i)]
    whole = staged_file(coded, job, 1, shards[0].path).read_bytes()
    ranged = httpx.get(url(1, shards[0].path), headers={**AUTH, "Range": "bytes=10-99"})
    assert ranged.status_code == 206 and ranged.content == whole[10:100]

    assert httpx.get(url(0, shards[0].path), timeout=GUARD).status_code == 401
    # An index the code has not, though a file lies there.
    beyond = staged_file(coded, job, CODE.width, shards[0].path)
    beyond.parent.mkdir(parents=True)
    beyond.write_bytes(b"not a stripe of rs(2,1)")
    assert httpx.get(url(CODE.width, shards[0].path), headers=AUTH).status_code == 404
    # A stray file in the area, under a name no shard has.
    stray = staged_file(coded, job, 0, "notes.txt")
    stray.write_text("nobody registered this")
    r = httpx.get(url(0, "notes.txt"), headers=AUTH, timeout=GUARD)
    assert r.status_code == 404 and r.headers["content-type"] == "application/problem+json"
    # A tier that keeps no stripes has none to serve.
    ssd = stripe_url(base, "ssd", 0, ShardRef(job, STEP, shards[0].path))
    assert httpx.get(ssd, headers=AUTH, timeout=GUARD).status_code == 404

    # Once the coded copy's expiry begins, its stripes are not handed to anyone.
    with sessions.begin() as s:
        stripes.expire(s, stripes.Move.EXPIRY_BEGUN, [(cp, "coded")])
    assert staged_file(coded, job, 0, shards[0].path).exists()
    assert httpx.get(url(0, shards[0].path), headers=AUTH, timeout=GUARD).status_code == 404


def test_a_holder_serves_the_stripe_it_holds_verified_to_a_restore(
    coded: Settings, sessions: sessionmaker[Session], server: DataServer
) -> None:
    cp, job, shards = ready(coded, sessions, server, 300_000)
    holder = holders_a()[0]
    held = serve(coded, sessions, holder, 0)
    try:
        sh = shards[0]

        def url(index: int) -> str:
            return stripe_url(held.url, "coded", index, ShardRef(job, STEP, sh.path))

        # Placed, not pulled yet: the holder has nothing verified to serve.
        assert httpx.get(url(0), headers=AUTH, timeout=GUARD).status_code == 404
        assert pull(coded, sessions, cp, job, holder).verified == 3
        with sessions() as s:
            size, crc = s.execute(
                select(Stripe.size, Stripe.crc32c)
                .join(Shard, Shard.id == Stripe.shard_id)
                .where(Stripe.checkpoint_id == cp, Shard.path == sh.path, Stripe.stripe_index == 0)
            ).one()
        r = httpx.get(url(0), headers=AUTH, timeout=GUARD)
        assert r.status_code == 200, r.text
        assert (len(r.content), crc_hex(r.content)) == (size, crc)
        ranged = httpx.get(url(0), headers={**AUTH, "Range": "bytes=5-49"}, timeout=GUARD)
        assert ranged.status_code == 206 and ranged.content == r.content[5:50]
        assert httpx.get(url(0), timeout=GUARD).status_code == 401
        # A stripe of the set it does not hold.
        assert httpx.get(url(1), headers=AUTH, timeout=GUARD).status_code == 404
        # Declared lost: what it holds is no longer handed to a restore.
        with sessions.begin() as s:
            mark_lost(s, holder, ["ssd"], "test")
        assert httpx.get(url(0), headers=AUTH, timeout=GUARD).status_code == 404
    finally:
        held.shutdown()
        held.server_close()
