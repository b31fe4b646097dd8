"""TierpointReader loads from a coded peer copy (rs(2,1)) on the real stack: two ranks save, the
lifecycle cuts each node's files into stripes that three other nodes pull and verify, and ranks
restarted on other nodes load every file from k stripes read off the holders' data endpoints,
decoded and verified, before the shared tier and S3 (which hold them too). A stripe a holder
cannot serve, and one with a flipped byte, are read around; with m+1 stripes of each file gone
the load reads the next tier.

A stripe read around because its bytes did not match is reported as the restore reports one: its
holder reads it back, and only a stripe bad at rest is moved `corrupt`; one damaged on the wire
(a real proxy process in front of its holder's data endpoint) is reported, read back good and
kept, and one its holder cannot serve is not reported at all."""

from __future__ import annotations

import asyncio
import shutil
import urllib.parse
from pathlib import Path
from typing import Any

import boto3
from sqlalchemy import select
from tierpoint_client import Checkpoint
from tierpoint_client.hashing import file_crc32c

from tests.client.torch.ranks import (
    WAIT,
    assert_loaded,
    new_job,
    ranks,
    run_ranks,
    s3_key,
    wait_everywhere,
)
from tests.helpers.client import Stack
from tests.helpers.flip_proxy import flip_proxy
from tests.helpers.integrity import events
from tests.helpers.rewrite_proxy import rewrite_proxy
from tierpoint.catalog.engine import make_sync_engine, sync_sessions
from tierpoint.catalog.models import Node, Shard, Stripe

TIERS = ("ssd", "peer", "lustre", "s3")


async def _saved(stack: Stack, tmp_path: Path, job: str, step: int) -> Checkpoint:
    await ranks(stack, tmp_path, "save", job, world=2, step=step)
    return await wait_everywhere(stack, job, step, TIERS)


def _held(stack: Stack, cp: Checkpoint) -> dict[str, dict[int, Path]]:
    """Per file, where each of its stripes lies on its holder's device, by index."""
    engine = make_sync_engine(stack.settings.database_url, pool_size=1)
    try:
        with sync_sessions(engine)() as s:
            rows = s.execute(
                select(Shard.path, Stripe.stripe_index, Stripe.node_id)
                .join(Shard, Shard.id == Stripe.shard_id)
                .where(Stripe.checkpoint_id == cp.id, Stripe.state == "verified")
            ).all()
    finally:
        engine.dispose()
    root = stack.settings.tier("peer")
    held: dict[str, dict[int, Path]] = {}
    for path, index, node in rows:
        held.setdefault(path, {})[index] = root.root_for(node) / cp.job / str(cp.step) / path
    return held


def _stripes(stack: Stack, cp: Checkpoint) -> dict[tuple[str, int], tuple[str, str, bool]]:
    """(file, index) -> (holder, state, read back since it was verified)."""
    engine = make_sync_engine(stack.settings.database_url, pool_size=1)
    try:
        with sync_sessions(engine)() as s:
            rows = s.execute(
                select(
                    Shard.path,
                    Stripe.stripe_index,
                    Stripe.node_id,
                    Stripe.state,
                    Stripe.scrubbed_at,
                )
                .join(Shard, Shard.id == Stripe.shard_id)
                .where(Stripe.checkpoint_id == cp.id)
            ).all()
    finally:
        engine.dispose()
    return {(r.path, r.stripe_index): (r.node_id, r.state, r.scrubbed_at is not None) for r in rows}


def _reported(stack: Stack, cp: Checkpoint) -> list[tuple[str, int]]:
    """The stripes reported to the server, (file, index), in the order reported."""
    engine = make_sync_engine(stack.settings.database_url, pool_size=1)
    try:
        assert cp.id is not None
        found = events(engine, cp.id, "corrupt_reported")
    finally:
        engine.dispose()
    return sorted((d["path"], d["stripe"]) for _, _, d in found if "stripe" in d)


def _data_url(stack: Stack, node: str) -> str:
    engine = make_sync_engine(stack.settings.database_url, pool_size=1)
    try:
        with sync_sessions(engine)() as s:
            url = s.scalar(select(Node.data_url).where(Node.id == node))
    finally:
        engine.dispose()
    assert url is not None
    return url


async def _read_back(stack: Stack, cp: Checkpoint, stripes: list[tuple[str, int]]) -> None:
    """Until each of `stripes` was read back on its holder (moved, or found good): a report's
    read-back may outlast the report's answer."""
    async with asyncio.timeout(WAIT):
        while True:
            now = await asyncio.to_thread(_stripes, stack, cp)
            if all(now[s][1] != "verified" or now[s][2] for s in stripes):
                return
            await asyncio.sleep(0.2)


async def _found_bad_and_cut_again(
    stack: Stack, cp: Checkpoint, stripes: list[tuple[str, int]]
) -> None:
    """Until the holders' read-backs found `stripes` bad (the coded tier's `corrupt` events count
    them) and the checkpoint's rebuild cut each again: verified, its holder's file the encoder's
    bytes (its recorded crc32c)."""
    engine = make_sync_engine(stack.settings.database_url, pool_size=1)
    root = stack.settings.tier("peer")

    def done() -> bool:
        assert cp.id is not None
        found = sum(d["stripes"] for _, t, d in events(engine, cp.id, "corrupt") if t == "peer")
        if found < len(stripes):
            return False
        with sync_sessions(engine)() as s:
            rows = {
                (r.path, r.stripe_index): r
                for r in s.execute(
                    select(Shard.path, Stripe.stripe_index, Stripe.node_id, Stripe.state)
                    .add_columns(Stripe.crc32c)
                    .join(Shard, Shard.id == Stripe.shard_id)
                    .where(Stripe.checkpoint_id == cp.id)
                )
            }
        for key in stripes:
            r = rows[key]
            on = root.root_for(r.node_id) / cp.job / str(cp.step) / key[0]
            if r.state != "verified" or not on.exists() or file_crc32c(on)[1] != r.crc32c:
                return False
        return True

    try:
        async with asyncio.timeout(WAIT):
            while True:
                if await asyncio.to_thread(done):
                    return
                await asyncio.sleep(0.2)
    finally:
        engine.dispose()


async def _load(
    stack: Stack, tmp_path: Path, job: str, step: int, nodes: tuple[str, ...]
) -> list[dict[str, Any]]:
    """Two ranks restarted on `nodes`, keeping nothing on them (each load reads the tiers)."""
    return await ranks(
        stack, tmp_path, "load", job, world=2, step=step, nodes=nodes, extra=("--no-repopulate",)
    )


async def test_a_load_reads_every_file_from_stripes_and_nothing_from_the_next_tiers(
    coded_stack: Stack, tmp_path: Path
) -> None:
    stack = coded_stack
    job, step = new_job(), 3
    cp = await _saved(stack, tmp_path, job, step)
    held = _held(stack, cp)
    assert set(held) == {s.path for s in cp.shards or ()}
    assert all(len(stripes) == 3 for stripes in held.values()), held
    # The next tiers' copies gone (the catalog still lists them): a load that read any of
    # them would fail.
    shutil.rmtree(stack.shared_dir(job, step))
    s3 = boto3.client("s3", endpoint_url=stack.settings.tier("s3").endpoint_url)
    for shard in cp.shards or ():
        bucket, key = s3_key(cp, shard.path)
        s3.delete_object(Bucket=bucket, Key=key)

    # The ranks restart on nodes that hold none of the files on their local tier.
    _, _, node_c, node_d, _ = stack.nodes
    loaded = await _load(stack, tmp_path, job, step, (node_c, node_d))
    assert_loaded(loaded, step)
    for report in loaded:
        assert set(report["stats"]["files"].values()) == {"peer"}, report
        assert report["warnings"] == [], report


async def test_stripes_that_cannot_be_read_or_do_not_match_are_read_around(
    coded_stack: Stack, tmp_path: Path
) -> None:
    stack = coded_stack
    job, step = new_job(), 4
    cp = await _saved(stack, tmp_path, job, step)
    held = _held(stack, cp)
    files = sorted(held)
    # Every file loses one stripe: a data stripe its holder cannot serve (gone from its device)
    # or one with a flipped byte (its holder serves it, its crc32c does not match).
    for n, path in enumerate(files):
        stripe = held[path][n % 2]
        if n % 2:
            was = stripe.read_bytes()
            stripe.write_bytes(was[:-1] + bytes([was[-1] ^ 0x01]))
        else:
            stripe.unlink()
    _, _, node_c, node_d, node_e = stack.nodes
    loaded = await _load(stack, tmp_path, job, step, (node_e, node_d))
    assert_loaded(loaded, step)
    for report in loaded:
        assert set(report["stats"]["files"].values()) == {"peer"}, report
        # Each stripe read around is said, with why.
        around = [w for w in report["warnings"] if "reading another stripe" in w]
        assert len(around) == len(report["stats"]["files"]), report
    # The flipped stripes were reported, read back on their holders and moved; the ones gone
    # were not reported (a holder that cannot serve a stripe says nothing of its bytes).
    flipped = [(path, n % 2) for n, path in enumerate(files) if n % 2]
    assert _reported(stack, cp) == flipped
    # Read back wrong on their holders (found bad, never before the holder's read-back), then cut
    # again by the rebuild that finding asks for; the ones gone were not reported, so they stand.
    await _found_bad_and_cut_again(stack, cp, flipped)
    now = _stripes(stack, cp)
    assert all(now[(path, n % 2)][1] == "verified" for n, path in enumerate(files)), now

    # m + 1 = 2 stripes of every file gone: the coded copy cannot give them, the shared tier does.
    # (Where they lie now: the flipped stripe was cut again, maybe on another holder.)
    for stripes in _held(stack, cp).values():
        for index, stripe in stripes.items():
            if index != 0 and stripe.exists():
                stripe.unlink()
    loaded = await _load(stack, tmp_path, job, step, (node_c, node_e))
    assert_loaded(loaded, step)
    for report in loaded:
        assert set(report["stats"]["files"].values()) == {"lustre"}, report


async def test_a_stripe_flipped_in_transit_is_reported_read_back_good_and_kept(
    coded_stack: Stack, tmp_path: Path
) -> None:
    stack = coded_stack
    job, step = new_job(), 5
    cp = await _saved(stack, tmp_path, job, step)
    before = _stripes(stack, cp)
    first = sorted(held for held in _held(stack, cp))[0]
    holder = before[(first, 0)][0]
    # Every stripe this holder serves gets a byte flipped on its way to the ranks, never at rest:
    # the ranks are handed the proxy's address for it (each file has at most one stripe there).
    real = _data_url(stack, holder)
    backend = urllib.parse.urlsplit(real).netloc
    through = sorted(k for k, (node, _, _) in before.items() if node == holder)
    with (
        flip_proxy(backend, -1) as flips,
        rewrite_proxy(stack.api_url, f"{real}/", f"{flips.url}/") as api,
    ):
        *_, node_d, node_e = stack.nodes
        loaded = await run_ranks(
            stack,
            tmp_path,
            "load",
            job,
            world=2,
            step=step,
            nodes=(node_e, node_d),
            extra=("--no-repopulate",),
            api_url=api,
        )
        seen = flips.stats()
    assert_loaded(loaded.reports, step)
    for report in loaded.reports:
        assert set(report["stats"]["files"].values()) == {"peer"}, report
    assert seen["flipped"] >= 1, seen
    # Every stripe the ranks read from that holder was reported; each was read back on the
    # holder, found good, and kept: the coded copy is whole.
    reported = _reported(stack, cp)
    assert (first, 0) in reported and set(reported) <= set(through), (reported, through)
    await _read_back(stack, cp, reported)
    now = _stripes(stack, cp)
    assert {k: v[1] for k, v in now.items()} == dict.fromkeys(before, "verified"), now
    assert all(now[k][2] for k in reported), now
