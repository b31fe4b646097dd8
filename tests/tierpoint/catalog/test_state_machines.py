"""The tier copy's and the replica's state machines, as the catalog runs them: every state change
a lifecycle, a retry, a repair, damage, a node declared lost, retention and an admin's deletion
make is a move of the transition tables (watched by triggers on the real tables, whatever code
path wrote it), and the docs show the tables as they are. A move's own rules (its sources, the
lock it needs) are tested beside it, tier_copy/test_machine.py; the lock order, test_locks.py."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select, text
from sqlalchemy.orm import Session

from tierpoint.catalog.checkpoint.deletion import delete_checkpoints
from tierpoint.catalog.checkpoint.registration import register_checkpoint
from tierpoint.catalog.engine import catalog_now
from tierpoint.catalog.job.lookup import checkpoint_head
from tierpoint.catalog.models import Replica, Shard
from tierpoint.catalog.node.registry import upsert_node
from tierpoint.catalog.policy.policies import assign_policy, create_policy
from tierpoint.catalog.replica import machine as replicas
from tierpoint.catalog.replica.machine import ReplicaWrite, upsert_replicas
from tierpoint.catalog.stripe import machine as stripes
from tierpoint.catalog.tier_copy import machine as tier_copies
from tierpoint.catalog.tier_copy.damage import mark_damaged
from tierpoint.catalog.tier_copy.expiry import begin_expiry, finish_expiry
from tierpoint.catalog.tier_copy.machine import drop_skipped_tier_copies, ensure_tier_copies
from tierpoint.catalog.tier_copy.node_lost import mark_lost
from tierpoint.catalog.tier_copy.promotion import promote
from tierpoint.catalog.tier_copy.retry import lock_failed, reset_failed
from tierpoint.contract.retention import BeginState
from tierpoint.manifest import Manifest, ShardSpec
from tierpoint.retention.policy import Policy, TierRef
from tierpoint.states import ReplicaState, TierState
from tierpoint.tier_config import TierKind

TIERS = [TierRef("ssd", TierKind.LOCAL), TierRef("lustre", TierKind.SHARED)]
ARCHITECTURE = Path(__file__).resolve().parents[3] / "docs" / "architecture.md"
WATCH = (
    "CREATE TABLE watched_moves (tbl text, old text, new text)",
    """CREATE FUNCTION watch_move() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      INSERT INTO watched_moves VALUES (
        TG_TABLE_NAME,
        CASE WHEN TG_OP = 'INSERT' THEN NULL ELSE OLD.state END,
        CASE WHEN TG_OP = 'DELETE' THEN NULL ELSE NEW.state END);
      RETURN NULL;
    END $$""",
    "CREATE TRIGGER watch_tier_copy AFTER INSERT OR DELETE OR UPDATE OF state ON checkpoint_tier "
    "FOR EACH ROW EXECUTE FUNCTION watch_move()",
    "CREATE TRIGGER watch_replica AFTER INSERT OR DELETE OR UPDATE OF state ON replica "
    "FOR EACH ROW EXECUTE FUNCTION watch_move()",
)


@pytest.fixture
def watched(session: Session) -> Iterator[Session]:
    """The session, with every state change of a tier copy or a replica recorded (the triggers
    go with the test's rolled-back transaction)."""
    for statement in WATCH:
        session.execute(text(statement))
    yield session


Moves = set[tuple[str | None, str | None]]


def _moves(session: Session) -> dict[str, Moves]:
    out: dict[str, Moves] = {"checkpoint_tier": set(), "replica": set()}
    for tbl, old, new in session.execute(text("SELECT tbl, old, new FROM watched_moves")):
        out[tbl].add((old, new))
    return out


def _allowed_tier_copy_moves() -> Moves:
    def v(s: TierState | None) -> str | None:
        return None if s is None else s.value

    return {(v(s), v(t.target)) for t in tier_copies.TRANSITIONS.values() for s in t.sources}


def _allowed_replica_moves() -> Moves:
    return {
        (None if s is None else s.value, to.value)
        for t in replicas.TRANSITIONS.values()
        for s in t.sources
        for to in t.targets
    }


class Scene:
    """One job on two nodes, its checkpoints registered and moved by the catalog's own code."""

    def __init__(self, session: Session) -> None:
        self.s = session
        self.job = f"machines-{uuid.uuid4().hex[:10]}"
        self.a, self.b = (f"node-{uuid.uuid4().hex[:8]}" for _ in range(2))
        for node in (self.a, self.b):
            upsert_node(session, node, {})
        policy = Policy.from_spec({"kinds": {"local": {"keep_last": 1}}})
        create_policy(session, self.job, policy, default=False, actor="test")
        assign_policy(session, self.job, self.job, actor="test")

    def register(self, step: int, node: str, tiers: list[str]) -> int:
        shard = ShardSpec(path="model.bin", size=10, crc32c="0badf00d", node=node)
        done = register_checkpoint(self.s, self.job, Manifest(step=step, shards=[shard]), tiers)
        return done.checkpoint_id

    def write(self, cid: int, tier: str, state: ReplicaState, node: str | None) -> None:
        shard = self.s.scalar(select(Shard.id).where(Shard.checkpoint_id == cid))
        assert shard is not None
        upsert_replicas(self.s, cid, tier, [ReplicaWrite(shard, state, f"/{tier}", node, 10)])

    def replica(self, cid: int, tier: str) -> int:
        found = self.s.scalar(
            select(Replica.id).where(Replica.checkpoint_id == cid, Replica.tier == tier)
        )
        assert found is not None
        return found


def _lifecycle_retry_and_repair(scene: Scene) -> int:
    s, a = scene.s, scene.a
    one = scene.register(1, a, ["ssd", "lustre", "s3"])
    head = checkpoint_head(s, one)
    assert head is not None
    ensure_tier_copies(s, head, ["ssd", "lustre", "s3", "ram"])
    drop_skipped_tier_copies(s, head, ["ram"])
    scene.write(one, "ssd", ReplicaState.COPYING, a)
    scene.write(one, "ssd", ReplicaState.VERIFIED, a)
    assert promote(s, one, "ssd", ["lustre", "s3"], None).state == "restorable"
    scene.write(one, "lustre", ReplicaState.CORRUPT, None)
    assert promote(s, one, "lustre", ["s3"], None).state == "failed"  # and s3 with it
    reset_failed(s, lock_failed(s, scene.job, 1), "test", "retry-1")
    scene.write(one, "lustre", ReplicaState.VERIFIED, None)
    assert promote(s, one, "lustre", ["s3"], None).state == "restorable"
    damage = mark_damaged(s, {scene.replica(one, "lustre"): "bit rot"}, ReplicaState.CORRUPT, "t")
    assert damage.demoted == {one: ["lustre"]}
    scene.write(one, "lustre", ReplicaState.VERIFIED, None)  # repair copied it back
    assert promote(s, one, "lustre", ["s3"], None).state == "restorable"
    assert promote(s, one, "s3", [], "gave up").state == "failed"
    assert "gave up again" in (promote(s, one, "s3", [], "gave up again").reason or "")
    return one


def test_every_state_change_the_catalog_makes_is_a_move_of_its_table(watched: Session) -> None:
    s = watched
    scene = Scene(s)
    one = _lifecycle_retry_and_repair(scene)

    # Retention: the newer step's local copy makes step 1's go (keep_last 1).
    two = scene.register(2, scene.a, ["ssd", "lustre"])
    scene.write(two, "ssd", ReplicaState.VERIFIED, scene.a)
    promote(s, two, "ssd", ["lustre"], None)
    now = catalog_now(s)
    assert begin_expiry(s, scene.job, one, "ssd", TIERS, now).state is BeginState.EXPIRING
    assert finish_expiry(s, one, "ssd") == "expired"

    # Node b is declared lost: its local copy of step 3, and the peer copy of step 2 it held.
    three = scene.register(3, scene.b, ["ssd", "lustre"])
    scene.write(three, "ssd", ReplicaState.VERIFIED, scene.b)
    promote(s, three, "ssd", ["lustre"], None)
    head = checkpoint_head(s, two)
    assert head is not None
    ensure_tier_copies(s, head, ["peer"])
    scene.write(two, "peer", ReplicaState.VERIFIED, scene.b)
    promote(s, two, "peer", [], None)
    lost = mark_lost(s, scene.b, ["ssd"], "test", ["peer"])
    assert lost.tier_copies_failed == 2

    # An admin deletes step 3: every copy goes to expiry, which ends it.
    delete_checkpoints(s, scene.job, 3, "test", force=True)
    assert finish_expiry(s, three, "ssd") == "expired"

    moves = _moves(s)
    assert moves["checkpoint_tier"] <= _allowed_tier_copy_moves(), moves["checkpoint_tier"]
    assert moves["replica"] <= _allowed_replica_moves(), moves["replica"]
    # The moves the prose of the states once left out happen, and the tables say so.
    for move in [("failed", "pending"), ("failed", "restorable"), ("restorable", "failed")]:
        assert move in moves["checkpoint_tier"]
    assert ("pending", "expiring") in moves["checkpoint_tier"]
    # Every move of the tier copy's table was made by this scene.
    assert moves["checkpoint_tier"] == _allowed_tier_copy_moves()


def _markdown(rows: list[tuple[str, str, str, str]]) -> str:
    lines = ["| move | from | to | why |", "|---|---|---|---|"]
    lines += [f"| {m} | {a} | {b} | {why} |" for m, a, b, why in rows]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("heading", "rows"),
    [
        ("Moves of a tier copy", tier_copies.describe()),
        ("Moves of a replica", replicas.describe()),
        ("Moves of a stripe", stripes.describe()),
    ],
)
def test_the_docs_show_each_transition_table_as_it_is(
    heading: str, rows: list[tuple[str, str, str, str]]
) -> None:
    doc = ARCHITECTURE.read_text()
    table = _markdown(rows)
    assert heading in doc and table in doc[doc.index(heading) :], (
        f"docs/architecture.md should hold this table under '{heading}':\n{table}"
    )


def test_the_states_module_leaves_the_moves_to_the_tables() -> None:
    import tierpoint.states

    doc = tierpoint.states.__doc__ or ""
    assert "->" not in doc, "states.py lists moves in prose: the transition tables are the one"
    assert "tier_copy/machine.py" in doc and "replica/machine.py" in doc
