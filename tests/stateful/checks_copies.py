"""The stateful test's invariants about where the copies are, each against the test's own model:

- an acknowledged registration's files stay: every registered shard's file on its writer's disk
  holds the registered bytes for as long as the store has not begun expiring that copy (the old
  checkpoint's delete of a step written again must not take the new files);
- a shard's peer copies sit on distinct live nodes, none its own: at any moment;
- once the job has settled, each shard has a copy on every peer tier retention keeps, unless the
  live nodes are too few for K distinct holders (a node's copies never go beside another)."""

from __future__ import annotations

from collections import defaultdict

from sqlalchemy import Engine

from tests.stateful.checks import GONE, markers, replicas
from tests.stateful.model import LOCAL, PEERS, Model, StepModel
from tests.stateful.stack import Stack


def check_acknowledged_files(stack: Stack, engine: Engine, model: Model) -> None:
    states = markers(engine, model.job)
    for sm in model.registered():
        state = states.get((sm.step, LOCAL), ("none", None))[0]
        if sm.escaped or state in GONE:
            continue
        for path, shard in sm.shards.items():
            if shard.node in model.lost_nodes or (LOCAL, path) in sm.damage:
                continue
            model.count("check: acknowledged file kept")
            data = stack.read(LOCAL, shard.node, model.job, sm.step, path)
            assert data == shard.data, (
                f"step {sm.step} {path!r} on {shard.node}: registered (201), its local copy "
                f"{state}, and the file is {'gone' if data is None else 'other bytes'}"
            )


def peer_holders(engine: Engine, model: Model) -> dict[tuple[int, str], dict[str, str]]:
    """(step, path) -> peer tier -> the node holding a verified copy there."""
    out: dict[tuple[int, str], dict[str, str]] = defaultdict(dict)
    for r in replicas(engine, model.job):
        if r.tier in PEERS and r.state == "verified" and r.node is not None:
            out[(r.step, r.path)][r.tier] = r.node
    return out


def check_distinct_holders(engine: Engine, model: Model) -> None:
    """No two copies of a shard on one node, none on its own node, none on a lost node."""
    for (step, path), held in peer_holders(engine, model).items():
        sm = model.steps.get(step)
        if sm is None or path not in sm.shards:
            continue
        model.count("check: peer copies on distinct live nodes")
        nodes = list(held.values())
        own = sm.shards[path].node
        assert len(set(nodes)) == len(nodes), f"step {step} {path!r}: copies share a node {held}"
        assert own not in nodes, f"step {step} {path!r}: a peer copy on its own node {held}"
        lost = set(nodes) & model.lost_nodes
        assert not lost, f"step {step} {path!r}: verified peer copies on lost nodes {held}"


def check_copies_made(engine: Engine, model: Model) -> None:
    """Once settled: K copies of every shard on K distinct live nodes, K the peer tiers that
    retention keeps the step on (not expiring nor expired) and never quarantined, or as many
    as the live nodes other than the shard's own and the other copies' holders allow."""
    states = markers(engine, model.job)
    held = peer_holders(engine, model)
    live = set(model.live_nodes())
    for sm in model.registered():
        if sm.destroyed or sm.escaped:
            continue
        kept = [
            t
            for t in PEERS
            if states.get((sm.step, t), ("none", None))[0] not in (*GONE, "none")
            and t not in sm.tier_quarantined_ever
        ]
        for path, shard in sm.shards.items():
            _check_shard(model, sm, path, kept, held.get((sm.step, path), {}), live - {shard.node})


def _check_shard(
    model: Model,
    sm: StepModel,
    path: str,
    kept: list[str],
    held: dict[str, str],
    others: set[str],
) -> None:
    model.count("check: K peer copies made")
    elsewhere = {n for t, n in held.items() if t not in kept}
    want = min(len(kept), len(others - elsewhere))
    have = sorted(t for t in kept if t in held)
    assert len(have) >= want, (
        f"step {sm.step} {path!r}: copies on {held}, want one on each of {kept} "
        f"while live nodes {sorted(others)} (other than its own) allow {want}"
    )
