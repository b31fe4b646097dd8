"""How TierpointReader reads, on the real stack: it re-populates this node's local tier from what a
load read elsewhere (another node's files kept as a cache the catalog records but lists as no
copy, used only once it verifies), and reads only the items a rank needs of a large S3 file,
each verified against its own crc32c."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.client.torch.ranks import (
    WAIT,
    assert_loaded,
    corrupt_file,
    corrupt_s3,
    new_job,
    ranks,
    run_ranks,
    until_event,
    wait_everywhere,
    wipe_local,
)
from tests.helpers.client import Stack


def _ours(reports: list[dict[str, object]]) -> list[str]:
    return [str(w) for r in reports for w in r["warnings"]]  # type: ignore[attr-defined]


async def test_a_load_repopulates_the_local_tier_which_the_next_load_reads(
    stack: Stack, tmp_path: Path
) -> None:
    job, step = new_job(), 70
    await ranks(stack, tmp_path, "save", job, world=2, step=step)
    cp = await wait_everywhere(stack, job, step)
    node_a, node_b = stack.nodes
    shared = stack.shared_dir(job, step)

    wipe_local(stack, job)
    off = await ranks(stack, tmp_path, "load", job, world=2, extra=("--no-repopulate",))
    assert_loaded(off, step)
    assert not stack.local_dir(node_a, job, step).exists()

    # Each rank reads the files its plan needs from the shared tier and writes them to its own
    # node's local tier: the next load on these nodes is local again.
    loaded = await ranks(stack, tmp_path, "load", job, world=2)
    assert_loaded(loaded, step)
    assert {".metadata", "__0_0.distcp"} <= set(loaded[0]["stats"]["files"])
    assert "__1_0.distcp" in loaded[1]["stats"]["files"]
    for node, report in zip((node_a, node_b), loaded, strict=True):
        read = report["stats"]["files"]
        assert set(read.values()) == {"lustre"}, read
        assert sorted(report["stats"]["repopulated"]) == sorted(read)
        local = stack.local_dir(node, job, step)
        # The files, identical to the shared copies, and no temporary names left behind.
        assert {p.name for p in local.iterdir()} == set(read)
        for path in read:
            assert (local / path).read_bytes() == (shared / path).read_bytes(), (node, path)
    again = await ranks(stack, tmp_path, "load", job, world=2)
    assert_loaded(again, step)
    for report in again:
        assert set(report["stats"]["files"].values()) <= {"ssd", "ssd (cache)"}, report
        assert report["stats"]["repopulated"] == []
    assert again[0]["stats"]["files"][".metadata"] == "ssd"  # the catalog's copy, back in place
    assert _ours(again) == []

    # One rank on node a needs node b's file too: it reads it from the shared tier and keeps a
    # copy on node a, which the catalog does not list.
    cached = stack.local_dir(node_a, job, step) / "__1_0.distcp"
    cached.unlink(missing_ok=True)  # the two-rank load may have cached it already
    one = await ranks(stack, tmp_path, "load", job, world=1)
    assert_loaded(one, step)
    assert one[0]["stats"]["files"]["__1_0.distcp"] == "lustre"
    assert one[0]["stats"]["repopulated"] == ["__1_0.distcp"]
    assert cached.read_bytes() == (shared / "__1_0.distcp").read_bytes()
    detail = await asyncio.to_thread(stack.client.checkpoint, job, step)
    replicas = next(s.replicas for s in detail.shards or () if s.path == "__1_0.distcp")
    assert {r.node for r in replicas if r.tier == "ssd"} == {node_b}

    # A cached copy that does not verify is dropped and replaced; it is ours, not a catalog copy,
    # so it is not reported to the server.
    corrupt_file(cached)
    fixed = await ranks(stack, tmp_path, "load", job, world=1)
    assert_loaded(fixed, step)
    warned = _ours(fixed)
    assert any("__1_0.distcp on tier ssd (cached copy) failed verification" in w for w in warned)
    assert not any("report" in w for w in warned), warned
    assert fixed[0]["stats"]["files"]["__1_0.distcp"] == "lustre"
    assert cached.read_bytes() == (shared / "__1_0.distcp").read_bytes()

    # With the shared and S3 copies corrupt, node a still loads from its cache, verified.
    corrupt_file(shared / "__1_0.distcp")
    corrupt_s3(stack, cp, "__1_0.distcp")
    cached_only = await ranks(stack, tmp_path, "load", job, world=1)
    assert_loaded(cached_only, step)
    assert cached_only[0]["stats"]["files"]["__1_0.distcp"] == "ssd (cache)"
    assert _ours(cached_only) == []


async def test_s3_reads_fetch_only_the_items_a_rank_needs(stack: Stack, tmp_path: Path) -> None:
    job, step = new_job(), 80
    await ranks(stack, tmp_path, "save", job, world=1, step=step)  # one file holds everything
    cp = await wait_everywhere(stack, job, step)
    size = {s.path: s.size for s in cp.shards or ()}
    ranged = ("--min-ranged-size", "0", "--no-repopulate")

    # Node b holds no copy of this checkpoint: a load there keeps what it read on node b, as
    # files the catalog records there (so that the local copy's expiry deletes them), not as
    # node b's copies.
    node_b = stack.nodes[1]
    elsewhere = await ranks(stack, tmp_path, "load", job, world=1, nodes=(node_b,))
    assert_loaded(elsewhere, step)
    assert sorted(elsewhere[0]["stats"]["repopulated"]) == [".metadata", "__0_0.distcp"]
    kept = stack.local_dir(node_b, job, step)
    assert {p.name for p in kept.iterdir()} == {".metadata", "__0_0.distcp"}
    detail = await asyncio.to_thread(stack.client.checkpoint, job, step)
    assert all(r.node != node_b for sh in detail.shards or () for r in sh.replicas)

    # A rank that needs the whole file reads it whole (and verifies its registered crc32c).
    whole = await ranks(stack, tmp_path, "load", job, world=1, tier="s3", extra=ranged)
    assert_loaded(whole, step)
    assert whole[0]["stats"]["files"] == {".metadata": "s3", "__0_0.distcp": "s3"}

    # A rank that needs one small tensor fetches only its bytes. The local and shared copies are
    # gone or corrupt, so the data comes from S3.
    wipe_local(stack, job)
    corrupt_file(stack.shared_dir(job, step) / "__0_0.distcp")
    part = await ranks(stack, tmp_path, "load", job, world=1, extra=(*ranged, "--only", "bias"))
    assert_loaded(part, step)
    stats = part[0]["stats"]
    assert stats["files"] == {".metadata": "lustre", "__0_0.distcp": "s3 (ranged)"}
    fetched = stats["bytes_fetched"] - size[".metadata"]
    assert 0 < fetched < size["__0_0.distcp"] // 2, (fetched, size)

    # That load reported the bad shared copy; the server confirmed it and repaired it (its
    # first round read the wiped local copy and marked it; later rounds copy the local tier
    # again from S3 and the shared one from it). Once every tier is restorable again, take the
    # local and shared copies away behind the catalog's back once more, so that the next load
    # has no good copy but S3's.
    await until_event(stack, job, step, ("repaired", "lustre"))
    async with asyncio.timeout(WAIT):
        while not all(  # noqa: ASYNC110 (polling the API)
            t.state == "restorable"
            for t in (await asyncio.to_thread(stack.client.checkpoint, job, step)).tiers
        ):
            await asyncio.sleep(0.5)
    wipe_local(stack, job)
    corrupt_file(stack.shared_dir(job, step) / "__0_0.distcp")

    # A ranged read verifies each item against its own crc32c: flipped bytes in S3 are caught.
    corrupt_s3(stack, cp, "__0_0.distcp", everywhere=True)
    failed = await run_ranks(
        stack, tmp_path, "load", job, world=1, extra=(*ranged, "--only", "bias"), expect_ok=False
    )
    # The error names what each tier gave, S3's failing item among them.
    assert "NoVerifiedCopyError" in failed.logs, failed.logs
    assert "s3: bytes " in failed.logs and " in .metadata" in failed.logs, failed.logs
