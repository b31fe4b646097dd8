"""One checkpoint's whole lifecycle (seal, copy and verify to the shared tier and S3, promotion)
and a client restore from S3, on moto and on a real Ceph RADOS Gateway. Where they differ: moto
stores the CRC32C each upload sends, so the S3 copy is verified against it; RGW 16.2 stores none
(and completes a multipart upload with an empty ETag), so the copy is verified by reading it
back. The client reads the gateway with the keys its tier names (`credentials_env`), while the
process's AWS chain holds moto's."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from tierpoint_client import build_manifest

from tests.client.conftest import _running_stack
from tests.helpers.client import Stack, read_tree, write_shards
from tests.helpers.s3_endpoints import S3Endpoint, moto_endpoint
from tests.helpers.services import Services

WAIT = 300.0  # hang guard only
MIB = 1024 * 1024


@pytest_asyncio.fixture(scope="module", loop_scope="session", params=["moto", "rgw"])
async def endpoint_stack(
    request: pytest.FixtureRequest,
    services: Services,
    migrated_url: str,
    temporal_namespace: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[tuple[S3Endpoint, Stack]]:
    endpoint: S3Endpoint = (
        request.getfixturevalue("rgw") if request.param == "rgw" else moto_endpoint(services)
    )
    root = tmp_path_factory.mktemp(f"client-{request.param}")
    tier = endpoint.tier(prefix="ckpt/")
    async with _running_stack(
        services, migrated_url, temporal_namespace, root, ("node-a", "node-b"), s3_tier=tier
    ) as running:
        yield endpoint, running


async def test_lifecycle_and_restore_from_s3(
    endpoint_stack: tuple[S3Endpoint, Stack], tmp_path: Path
) -> None:
    endpoint, stack = endpoint_stack
    job, step, node = f"s3-{endpoint.kind}-{uuid.uuid4().hex[:8]}", 7, stack.nodes[0]
    local = stack.local_dir(node, job, step)
    # One shard above the 16 MiB part size: a multipart upload; the others single PUTs.
    shards = write_shards(local, {"model/0.distcp": 17 * MIB + 3, "model/1.distcp": MIB, "x": 0})
    await asyncio.to_thread(stack.client.register_manifest, job, step, build_manifest(local, node))
    for tier in ("lustre", "s3"):
        await stack.wait_restorable(job, step, tier, WAIT)

    cp = await asyncio.to_thread(stack.client.checkpoint, job, step)
    s3_copies = [r for s in cp.shards or () for r in s.replicas if r.tier == "s3"]
    assert len(s3_copies) == 3 and {r.state for r in s3_copies} == {"verified"}
    head = endpoint.client().head_object(
        Bucket=stack.settings.tier("s3").bucket,
        Key=f"ckpt/{job}/{step}/model/0.distcp",
        ChecksumMode="ENABLED",
    )
    assert ("ChecksumCRC32C" in head) is endpoint.stores_checksums

    dest = tmp_path / "restored"
    await asyncio.to_thread(stack.client.restore, job, dest, tier="s3")
    assert read_tree(dest) == shards
