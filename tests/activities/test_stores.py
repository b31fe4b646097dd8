"""The worker's tier stores (activities/stores.py), with no service at all: one store per tier
(per node, for the nodes' own tiers) opened once and shared by every activity thread, and a
node's tier reachable only from that node's worker."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError

from activities.stores import Stores, ensure_reachable
from tests.helpers.services import catalog_only_settings
from tierpoint.config import Settings
from tierpoint.contract.common import FailureType

NODE_A, NODE_B = "node-a", "node-b"


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    # The database is never reached here: the stores are files.
    return catalog_only_settings("postgresql+psycopg://nowhere.invalid/none", tmp_path)


def test_one_store_per_tier_and_node_shared_by_every_thread(settings: Settings) -> None:
    stores = Stores(settings)
    ssd, lustre = stores.tier("ssd"), stores.tier("lustre")
    with ThreadPoolExecutor(8) as pool:
        opened = list(pool.map(lambda _: stores.get(ssd, NODE_A), range(32)))
    assert all(store is opened[0] for store in opened)
    assert stores.get(ssd, NODE_B) is not opened[0]
    # A shared tier is one store whichever node asks.
    assert stores.get(lustre, NODE_A) is stores.get(lustre, NODE_B) is stores.get(lustre, None)


def test_a_nodes_tier_is_reachable_only_from_its_own_worker(settings: Settings) -> None:
    ssd, lustre = settings.tier("ssd"), settings.tier("lustre")
    ensure_reachable(ssd, NODE_A, NODE_A)
    for node, worker in [(NODE_A, NODE_B), (NODE_A, None), (None, NODE_A)]:
        with pytest.raises(ApplicationError, match="not reachable") as refused:
            ensure_reachable(ssd, node, worker)
        assert refused.value.non_retryable
        assert refused.value.type == FailureType.WRONG_NODE
    for worker in (NODE_A, None):
        ensure_reachable(lustre, None, worker)
