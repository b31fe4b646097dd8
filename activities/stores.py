"""Open tier stores once per worker process and share them between activity threads."""

from __future__ import annotations

import threading

from temporalio.exceptions import ApplicationError

from tierpoint.config import Settings
from tierpoint.contract.common import FailureType
from tierpoint.storage.base import TierStore
from tierpoint.storage.registry import keyed, open_store
from tierpoint.storage.s3.layout import KeyLayout
from tierpoint.tier_config import TierConfig


class Stores:
    """`threads`: the process's activity threads, each of which may use a store at once."""

    def __init__(self, settings: Settings, threads: int = 0) -> None:
        self._settings = settings
        self._threads = threads
        self._lock = threading.Lock()
        self._open: dict[tuple[str, str | None], TierStore] = {}

    def tier(self, name: str) -> TierConfig:
        return self._settings.tier(name)

    def get(self, tier: TierConfig, node: str | None, layout: KeyLayout | None = None) -> TierStore:
        """The store of `tier`; local and peer tiers are per node, the others ignore the node.
        An S3 store names objects with `layout`, the one the catalog recorded for the checkpoint
        (`catalog/tier_copy/key_layouts.py`); without it, it can list but not name a shard."""
        key = (tier.name, node if tier.on_nodes else None)
        with self._lock:
            store = self._open.get(key)
            if store is None:
                store = open_store(tier, key[1], threads=self._threads)
                self._open[key] = store
        return store if layout is None else keyed(store, layout)


def ensure_reachable(tier: TierConfig, node: str | None, worker_node: str | None) -> None:
    """A local or peer tier is reachable only on its own node's worker: a task for it anywhere
    else is a routing bug, which no retry mends."""
    if tier.on_nodes and (node is None or node != worker_node):
        raise ApplicationError(
            f"tier {tier.name} of node {node} is not reachable from worker "
            f"{worker_node or 'shared'}",
            type=FailureType.WRONG_NODE,
            non_retryable=True,
        )
