"""A node without an S3 tier's keys loads from the copies it can read. The S3 tier here names an
environment prefix for its keys (`credentials_env`), as a cluster's does: the server has them,
the training nodes do not. Their loads, by URL and with TierpointReader, come from the local tier
and then from the shared tier; only when the S3 copy is the one left to read is the load refused,
with an error naming the variables to set."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from tests.client.conftest import _running_stack
from tests.client.torch.ranks import assert_loaded, new_job, ranks, wait_everywhere, wipe_local
from tests.client.torch.test_fsspec_dcp import ok, url_ranks
from tests.helpers.client import Stack
from tests.helpers.s3_endpoints import moto_endpoint
from tests.helpers.services import Services

PREFIX = "TIERPOINT_TEST_NODE_KEYS"
KEYS = (f"{PREFIX}_ACCESS_KEY_ID", f"{PREFIX}_SECRET_ACCESS_KEY")
NO_KEYS: dict[str, str | None] = dict.fromkeys(KEYS)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def keyed_stack(
    services: Services,
    migrated_url: str,
    temporal_namespace: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Stack]:
    """The stack, its S3 tier signing with the keys under PREFIX. They are in this process's
    environment, where the server's workers (run here) copy and verify with them."""
    tier = moto_endpoint(services).tier(credentials_env=PREFIX)
    root = tmp_path_factory.mktemp("client-keyed")
    with pytest.MonkeyPatch.context() as env:
        env.setenv(KEYS[0], services.s3_access_key_id)
        env.setenv(KEYS[1], services.s3_secret_access_key)
        async with _running_stack(
            services, migrated_url, temporal_namespace, root, ("node-a", "node-b"), s3_tier=tier
        ) as running:
            yield running


async def test_a_node_without_s3_keys_loads_from_the_local_then_the_shared_tier(
    keyed_stack: Stack, tmp_path: Path
) -> None:
    stack = keyed_stack
    # One step saved by URL, loaded by URL; one saved with TierpointWriter, loaded with
    # TierpointReader.
    by_url, by_reader, step = new_job("nokeys"), new_job("nokeys"), 3
    url = f"tierpoint://{by_url}/step-{step}"
    ok(await url_ranks(stack, tmp_path, "save", url, step, world=2))
    await ranks(stack, tmp_path, "save", by_reader, world=2, step=step)
    for job in (by_url, by_reader):
        await wait_everywhere(stack, job, step)

    async def read_with_reader(tier: str) -> None:
        """Each rank's own file read from `tier` (another node's, from the shared tier)."""
        loaded = await ranks(
            stack,
            tmp_path,
            "load",
            by_reader,
            world=2,
            step=step,
            env=NO_KEYS,
            extra=("--no-repopulate",),
        )
        assert_loaded(loaded, step)
        assert [r["stats"]["files"][f"__{r['rank']}_0.distcp"] for r in loaded] == [tier] * 2
        assert {t for r in loaded for t in r["stats"]["files"].values()} <= {tier, "lustre"}

    # The local tier.
    ok(await url_ranks(stack, tmp_path, "load", url, step, world=2, env=NO_KEYS))
    await read_with_reader("ssd")

    # The shared tier, once the local copies are gone.
    for job in (by_url, by_reader):
        wipe_local(stack, job)
    ok(await url_ranks(stack, tmp_path, "load", url, step, world=2, env=NO_KEYS))
    await read_with_reader("lustre")

    # S3 is the one copy left: the missing keys are the error, naming what to set.
    wipe_local(stack, by_url)  # the load by URL put each node's own files back
    for f in stack.shared_dir(by_url, step).iterdir():
        f.unlink()
    refused = await url_ranks(stack, tmp_path, "load", url, step, world=2, env=NO_KEYS)
    assert all(KEYS[0] in r.get("error", "") for r in refused), refused
    # With the keys, the same nodes read S3.
    ok(await url_ranks(stack, tmp_path, "load", url, step, world=2))
