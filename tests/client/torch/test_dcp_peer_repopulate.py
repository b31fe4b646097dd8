"""A rank restarted on a spare node after its node was declared lost loads that node's files from
their peer copy and, with re-population on, keeps them on the spare node's local tier: the next
restart there reads them locally, and nothing is read from a peer again."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.client.torch.ranks import assert_loaded, new_job, ranks, wait_everywhere
from tests.helpers.client import Stack


def _same_bytes(mine: Path, location: str | None) -> bool:
    return location is not None and mine.read_bytes() == Path(location).read_bytes()


async def test_a_spare_node_keeps_the_lost_nodes_files_it_loaded_from_a_peer(
    peer_stack: Stack, tmp_path: Path
) -> None:
    stack = peer_stack
    node_a, node_b, spare = stack.nodes
    job, step = new_job(), 6
    await ranks(stack, tmp_path, "save", job, world=2, step=step)
    cp = await wait_everywhere(stack, job, step, ("peer", "lustre", "s3"))
    lost_files = {s.path for s in cp.shards or () if s.node == node_a}
    held_by = {s.path: r for s in cp.shards or () for r in s.replicas if r.tier == "peer"}
    assert ".metadata" in lost_files and all(held_by[p].node == node_b for p in lost_files)

    await asyncio.to_thread(stack.client._http.request, "POST", f"/v1/nodes/{node_a}/lost")
    on_spare = stack.local_dir(spare, job, step)
    replaced = (spare, node_b)  # rank 0 restarts on the spare node, rank 1 stays on node b

    off = await ranks(
        stack, tmp_path, "load", job, world=2, nodes=replaced, extra=("--no-repopulate",)
    )
    assert_loaded(off, step)
    assert off[0]["stats"]["repopulated"] == []
    assert not on_spare.exists()

    loaded = await ranks(stack, tmp_path, "load", job, world=2, nodes=replaced)
    assert_loaded(loaded, step)
    read = loaded[0]["stats"]["files"]
    from_peer = {p for p, where in read.items() if where == "peer" and p in lost_files}
    assert ".metadata" in from_peer, read
    # Every file it read is kept on the spare node (none is its own), the lost node's byte for
    # byte the peer copies (on node b's peer tier), each recorded so that the expiry of the
    # checkpoint's local copy deletes it there.
    assert sorted(loaded[0]["stats"]["repopulated"]) == sorted(read)
    assert {p.name for p in on_spare.iterdir()} == set(read)
    for path in from_peer:
        assert _same_bytes(on_spare / path, held_by[path].location), path
    # The catalog lists no copy on the spare node: it is the reader's cache.
    after = await asyncio.to_thread(stack.client.checkpoint, job, step)
    assert all(r.node != spare for s in after.shards or () for r in s.replicas if r.tier == "ssd")

    again = await ranks(stack, tmp_path, "load", job, world=2, nodes=replaced)
    assert_loaded(again, step)
    reread = again[0]["stats"]["files"]
    assert {reread[p] for p in from_peer} == {"ssd (cache)"}, reread
    assert again[0]["stats"]["repopulated"] == []
