"""`copies = K` means K copies on K distinct nodes, also after a holder is lost: re-replication puts
the lost holder's copy on a live node that holds none of the node's other copies (in a rack none
of them is in, while there is one), never beside another copy of the same shards. When no such
node is left, the copy is not made and the peer tier says why, instead of two "copies" on one
node that one node's loss takes together while both tiers say restorable.

As the attacker met it: ssd -> peer (2 or 3 copies) -> s3, 3 to 5 nodes, with and without racks;
the holder of the writer's first copy declared lost through the API. Real services (Temporal dev
server, Postgres, moto, the API in the test process), real files, real workers and endpoints."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client
from tierpoint_client import Client as TierpointClient

from api.app import create_app
from tests.helpers.cli import serving
from tests.helpers.consistency import assert_catalog_matches_tiers
from tests.helpers.lifecycle import RESULT_TIMEOUT, markers, running_workers
from tests.helpers.peer_faults import (
    checkpoint_id,
    peer_copies,
    peer_settings,
    wait_for_endpoints,
    write_and_register,
)
from tests.helpers.services import fresh_database
from tests.helpers.tokens import bearer, create_token
from tierpoint.catalog.models import Event
from tierpoint.config import Settings
from tierpoint.contract.peer import rereplicate_id

STEP = 5


@pytest.fixture
def migrated_url(_template_url: str) -> str:
    """A catalog of each case's own: placement's ring is every node that reported in lately, and
    an earlier case's nodes, which no worker serves now, must not be in it."""
    return fresh_database(_template_url, template=True)


@pytest.mark.parametrize(
    ("copies", "count", "racks", "replacement"),
    [
        # a's copies on b and c; b lost: d, not c.
        pytest.param(2, 4, None, "d", id="2-copies-4-nodes"),
        # a's copies on b, c, d; b lost: e, not c.
        pytest.param(3, 5, None, "e", id="3-copies-5-nodes"),
        # Racks 1 2 3 1 2: a's copies on b (rack 2) and c (rack 3); b lost: e (rack 2), not c
        # (holds the other copy) nor d (a's own rack).
        pytest.param(2, 5, "12312", "e", id="2-copies-5-nodes-racks"),
        # a's copies on b and c; b lost: no live node other than a and c is left.
        pytest.param(2, 3, None, None, id="2-copies-3-nodes-none-left"),
    ],
)
async def test_a_lost_holders_copy_is_made_again_on_a_node_holding_no_other_copy(
    settings: Settings,
    sessions: sessionmaker[Session],
    client: Client,
    tmp_path: Path,
    engine: Engine,
    copies: int,
    count: int,
    racks: str | None,
    replacement: str | None,
) -> None:
    tag = uuid.uuid4().hex[:8]
    nodes = [f"{tag}-{x}" for x in "abcde"[:count]]
    a, b = nodes[0], nodes[1]
    domains = {n: f"rack-{r}" for n, r in zip(nodes, racks, strict=True)} if racks else None
    cfg = peer_settings(
        settings, tmp_path, nodes, below=("s3",), copies=copies, failure_domain=domains
    )
    peers = [t.name for t in cfg.peer_tiers()]
    job = f"distinct-{tag}"
    admin = create_token(cfg.database_url, scopes=["admin"])
    trainer_token = create_token(cfg.database_url, scopes=[f"train:{job}"])
    async with (
        running_workers(cfg, client, nodes=nodes),
        serving(create_app(cfg)) as api,
        httpx.AsyncClient(base_url=api, headers=bearer(admin), timeout=30) as http,
    ):
        await wait_for_endpoints(sessions, nodes, 60)
        trainer = TierpointClient(api, token=trainer_token)
        result = await write_and_register(trainer, client, cfg, job, STEP, [a])
        assert all(t.state == "restorable" for t in result.tiers), result
        cid = checkpoint_id(sessions, job, STEP)
        before = {t: _holders(sessions, cid, t) for t in peers}
        assert before["peer"] == {b}, before

        r = await http.post(f"/v1/nodes/{b}/lost")
        assert r.status_code == 200 and r.json()["peer_rereplications"] == 1, r.text
        await asyncio.wait_for(
            client.get_workflow_handle(rereplicate_id(job, STEP)).result(), RESULT_TIMEOUT
        )

    state = markers(sessions, cid)
    # The other copies stayed where they were.
    for t in peers[1:]:
        assert state[t][0] == "restorable" and _holders(sessions, cid, t) == before[t], state
    others = {n for t in peers[1:] for n in before[t]}
    if replacement is None:
        status, reason = state["peer"]
        assert status == "failed", state
        assert reason is not None and "holders of their other copies" in reason, reason
        assert {c.node for c in peer_copies(sessions, cid).values()} == {b}, "copy made anyway"
        assert any(reason in (e.get("reason") or "") for e in _failed_events(sessions, cid))
    else:
        assert state["peer"] == ("restorable", None), state
        assert _holders(sessions, cid, "peer") == {f"{tag}-{replacement}"}
        assert f"{tag}-{replacement}" not in others
    # Each of a's shards: its verified copies on distinct live nodes, none on a.
    verified: dict[str, list[str]] = {}
    for t in peers:
        for path, c in peer_copies(sessions, cid, t).items():
            if c.state == "verified":
                assert c.node is not None
                verified.setdefault(path, []).append(c.node)
    for held in verified.values():
        assert len(set(held)) == len(held) and a not in held and b not in held, verified
    assert_catalog_matches_tiers(cfg, engine, [cid])


def _holders(sessions: sessionmaker[Session], cid: int, tier: str) -> set[str | None]:
    return {c.node for c in peer_copies(sessions, cid, tier).values() if c.state == "verified"}


def _failed_events(sessions: sessionmaker[Session], cid: int) -> list[dict[str, str]]:
    with sessions() as s:
        rows = s.scalars(
            select(Event.detail).where(
                Event.checkpoint_id == cid, Event.kind == "failed", Event.tier == "peer"
            )
        )
        return [dict(d or {}) for d in rows]
