"""A lost node's rank restarts on a spare node and loads with TierpointReader from the peer copy
of its files, read through the holding node's data endpoint and verified, before the shared tier
and S3 (which hold them too)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.client.torch.ranks import assert_loaded, new_job, ranks, wait_everywhere
from tests.helpers.client import Stack


async def test_a_spare_node_loads_a_lost_nodes_files_from_their_peer_copy(
    peer_stack: Stack, tmp_path: Path
) -> None:
    stack = peer_stack
    node_a, node_b, spare = stack.nodes
    job, step = new_job(), 5
    await ranks(stack, tmp_path, "save", job, world=2, step=step)
    cp = await wait_everywhere(stack, job, step, ("peer", "lustre", "s3"))
    held = {s.path: r.node for s in cp.shards or () for r in s.replicas if r.tier == "peer"}
    ring = {node_a: node_b, node_b: spare}
    # The ring over the three live nodes: node-a's files on node-b, node-b's on the spare.
    assert held == {s.path: ring[s.node] for s in cp.shards or ()}

    await asyncio.to_thread(stack.client._http.request, "POST", f"/v1/nodes/{node_a}/lost")
    # Rank 0 (node-a's) restarts on the spare node; rank 1 stays on node-b.
    loaded = await ranks(stack, tmp_path, "load", job, world=2, nodes=(spare, node_b))
    assert_loaded(loaded, step)
    mine = {s.path for s in cp.shards or () if s.node == node_a}
    read = loaded[0]["stats"]["files"]
    assert mine and all(read[p] == "peer" for p in mine if p in read), read
    assert ".metadata" in mine and read[".metadata"] == "peer"
