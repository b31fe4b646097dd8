"""The node registry on a real catalog: nodes report in (many in one statement), a node declared
lost stays lost whatever its worker reports, and a plan reads which of its nodes are lost under a
share lock that orders it with a declaration in flight. (The declaration itself:
tests/api/test_node_lost.py.)"""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import Engine, select, text, update
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from tests.helpers.catalog_rows import declare_lost, one_shard_checkpoint, write_replica
from tierpoint.catalog.models import Node
from tierpoint.catalog.node.registry import lost_among, upsert_node, upsert_nodes
from tierpoint.states import ReplicaState


def test_lost_among_names_only_the_lost_nodes(session: Session) -> None:
    gone, alive = (f"node-{uuid.uuid4().hex[:8]}" for _ in range(2))
    for n in (gone, alive):
        upsert_node(session, n, {})
    declare_lost(session, gone)
    assert lost_among(session, [alive, gone, gone, "never-reported"]) == [gone]
    assert lost_among(session, []) == []


def test_a_declaration_waits_for_a_seal_that_read_the_node_as_alive(catalog_engine: Engine) -> None:
    """The seal's share lock on the node row orders it with a declaration in flight: the
    declaration cannot commit between the seal's read of `lost_at` and its write, so it either
    sees the seal's rows (and marks them lost) or the seal sees the declaration."""
    node = f"node-{uuid.uuid4().hex[:8]}"
    with Session(catalog_engine) as setup, setup.begin():
        cp, shard = one_shard_checkpoint(setup, node)
    with Session(catalog_engine) as seal, seal.begin():
        write_replica(seal, cp, shard, node, ReplicaState.VERIFIED)
        with Session(catalog_engine) as operator, operator.begin():
            operator.execute(text("SET LOCAL lock_timeout = '300ms'"))
            with pytest.raises(OperationalError, match="lock timeout"):
                declare_lost(operator, node)
    with Session(catalog_engine) as operator, operator.begin():
        declare_lost(operator, node)
        assert lost_among(operator, [node]) == [node]


def test_nodes_reporting_in_together_are_all_seen_and_a_lost_one_stays_lost(
    session: Session,
) -> None:
    """A worker process serving many nodes' queues reports them in with one statement."""
    lost, live = (f"node-{uuid.uuid4().hex[:8]}" for _ in range(2))
    upsert_node(session, lost, {})
    declare_lost(session, lost)
    session.execute(update(Node).values(last_seen_at=None).where(Node.id == lost))
    upsert_nodes(session, {live: {"ssd": "/l"}, lost: {"ssd": "/x"}})
    rows = {n.id: n for n in session.scalars(select(Node).where(Node.id.in_([lost, live])))}
    assert rows[lost].lost_at is not None and rows[lost].last_seen_at is not None
    assert rows[lost].local_roots == {"ssd": "/x"}
    assert rows[live].lost_at is None and rows[live].local_roots == {"ssd": "/l"}
