"""The activities each worker registers are read off the activity classes
(activities/registration.py): every activity the contract names is served on the shared queue,
and a node's queue serves the ones that touch its local tier."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from activities.registration import activities_of
from activities.stores import Stores
from apps.worker import activity_objects
from tierpoint.config import Settings
from tierpoint.contract import integrity, lifecycle, peer, retention, stripes


def _names(fns: list[Any]) -> set[str]:
    return {fn.__temporal_activity_definition.name for fn in fns}


def _contract_names() -> set[str]:
    prefixes = ("lifecycle.", "retention.", "scrub.", "repair.", "reconcile.", "peer.", "stripes.")
    return {
        value
        for module in (lifecycle, retention, integrity, peer, stripes)
        for name, value in vars(module).items()
        if name.isupper() and isinstance(value, str) and value.startswith(prefixes)
    }


def test_every_activity_of_the_contract_is_served_and_node_queues_serve_their_own(
    settings: Settings, sessions: sessionmaker[Session]
) -> None:
    stores = Stores(settings)
    shared = _names(activities_of(*activity_objects(sessions, settings, stores)))
    assert shared == _contract_names()
    node = _names(
        activities_of(*activity_objects(sessions, settings, stores, node="n"), node_queue=True)
    )
    assert node == {
        lifecycle.SEAL_BATCH,
        lifecycle.COPY_BATCH,
        retention.DELETE,
        integrity.SCRUB_BATCH,
        integrity.REPAIR_COPY,
        integrity.RECONCILE_SCAN,
        stripes.ENCODE_BATCH,
        stripes.PULL_BATCH,
        stripes.UNSTAGE_BATCH,
        stripes.REBUILD_BATCH,
    }
