"""The stateful test's invariants, each comparing the real stack with the test's own model.

Two kinds: those that hold at any moment (no unregistered file is ever deleted; latest, read under
a lease, offers only the registered bytes), checked after every step; and those that hold once the
job has settled (no workflow of it runs): every verified copy holds the registered bytes, every
checkpoint the store must keep has such a copy, protected copies were never expired, and only the
test quarantined anything."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, text

from tests.stateful.model import LOCAL, Model, StepModel
from tests.stateful.stack import Stack, code

GONE = frozenset({"expiring", "expired"})


@dataclass(frozen=True)
class Replica:
    step: int
    path: str
    size: int
    checksum: str | None
    tier: str
    node: str | None
    state: str
    location: str


def markers(engine: Engine, job: str) -> dict[tuple[int, str], tuple[str, str | None]]:
    """(step, tier) -> (marker state, its quarantine reason)."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT ct.step, ct.tier, ct.state, ct.quarantine_reason FROM checkpoint_tier ct "
                "JOIN job j ON j.id = ct.job_id WHERE j.name = :job"
            ),
            {"job": job},
        )
        return {(r.step, r.tier): (r.state, r.quarantine_reason) for r in rows}


def replicas(engine: Engine, job: str) -> list[Replica]:
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT c.step, s.path, s.size, s.checksum, r.tier, r.node_id, r.state, "
                "r.location FROM replica r JOIN shard s ON s.id = r.shard_id "
                "JOIN checkpoint c ON c.id = r.checkpoint_id JOIN job j ON j.id = c.job_id "
                "WHERE j.name = :job ORDER BY c.step, s.ordinal, r.tier"
            ),
            {"job": job},
        )
        return [Replica(*r) for r in rows]


def registered_shards(engine: Engine, job: str) -> dict[int, dict[str, tuple[int, str | None]]]:
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT c.step, s.path, s.size, s.checksum FROM shard s "
                "JOIN checkpoint c ON c.id = s.checkpoint_id JOIN job j ON j.id = c.job_id "
                "WHERE j.name = :job"
            ),
            {"job": job},
        )
        out: dict[int, dict[str, tuple[int, str | None]]] = {}
        for step, path, size, checksum in rows:
            out.setdefault(step, {})[path] = (size, checksum)
        return out


def check_unregistered(stack: Stack, engine: Engine, model: Model) -> None:
    """No file the test put on a tier without registering it is ever deleted or changed."""
    if not model.unregistered:
        return
    states = markers(engine, model.job)
    for (tier, node, job, step, path), data in model.unregistered.items():
        model.count("check: unregistered file kept")
        if stack.read(tier, node, job, step, path) == data:
            continue
        mine = job == model.job
        state = states.get((step, tier), ("none", None))[0] if mine else "none"
        raise AssertionError(
            f"an unregistered file was deleted or changed: {tier} {node} {job}/{step}/{path!r} "
            f"(the copy there is {state})"
        )


def check_settled(stack: Stack, engine: Engine, model: Model) -> None:
    """Once no workflow of the job runs: the catalog holds what was registered, every verified
    copy holds the registered bytes, every checkpoint the store must keep is restorable with
    them somewhere, protected copies were never expired, nothing was quarantined by the store."""
    catalog = registered_shards(engine, model.job)
    for sm in model.registered():
        want: dict[str, tuple[int, str | None]] = {
            p: (len(s.data), s.crc) for p, s in sm.shards.items()
        }
        got = catalog.get(sm.step, {})
        if not sm.crc_registered and sm.destroyed:
            # Its node was lost (or its bytes destroyed) before the seal could compute them.
            want = {
                p: (n, crc if got.get(p, (n, None))[1] else None) for p, (n, crc) in want.items()
            }
        assert got == want, f"step {sm.step}: the catalog holds {got}, registered {want}"
        model.count("check: registration kept")
    assert set(catalog) == set(model.steps), (
        f"checkpoints nobody registered: {sorted(set(catalog) - set(model.steps))}"
    )
    check_confined(engine, model)
    reps = replicas(engine, model.job)
    good: dict[tuple[int, str], set[str]] = {}
    for r in reps:
        if r.state != "verified":
            continue
        data = stack.read_location(r.location)
        expected = model.expected(r.step, r.path)
        damaged = (r.tier, r.path) in model.steps[r.step].damage
        model.count("check: verified replica bytes")
        if not damaged:
            assert data == expected, (
                f"step {r.step} {r.tier} {r.path!r}: verified, but the bytes at {r.location} "
                f"are {'missing' if data is None else 'not the registered ones'}"
            )
            good.setdefault((r.step, r.tier), set()).add(r.path)
    states = markers(engine, model.job)
    for sm in model.registered():
        restorable = [
            t for (s, t), (state, _) in states.items() if s == sm.step and state == "restorable"
        ]
        for tier in restorable:
            have = good.get((sm.step, tier), set())
            harmed = {p for t, p in sm.damage if t == tier}
            missing = set(sm.shards) - have - harmed
            assert not missing, f"step {sm.step} restorable on {tier} without {sorted(missing)}"
        _check_kept(model, sm, states, good)


def _check_kept(
    model: Model,
    sm: StepModel,
    states: dict[tuple[int, str], tuple[str, str | None]],
    good: dict[tuple[int, str], set[str]],
) -> None:
    if model.must_keep(sm):
        model.count("check: kept checkpoint has a good copy")
        whole = [
            t
            for (s, t), (state, _) in states.items()
            if s == sm.step and state == "restorable" and good.get((s, t)) == set(sm.shards)
        ]
        if not whole and any(
            good.get((s, t), set()) | {p for dt, p in sm.damage if dt == t} == set(sm.shards)
            for (s, t), (state, _) in states.items()
            if s == sm.step and state == "restorable"
        ):
            # What is left is a copy the test damaged and nothing has read back since: the
            # store could not know (retention trusts a verified copy until it is read again).
            model.count("tolerated: only a copy the test damaged is left")
            whole = ["damaged"]
        mine = {t: st for (s, t), (st, _) in states.items() if s == sm.step}
        if (
            not whole
            and set(mine.values()) <= {"expired", "failed"}
            and any(st == "failed" for t, st in mine.items() if t in sm.damaged_tiers)
        ):
            # The copy the test damaged was found bad after the others had expired (they were
            # not needed while it read as good): lost to the test's damage, not to the store.
            model.count("tolerated: lost to the test's damage after the others expired")
            whole = ["damaged"]
        assert whole, (
            f"step {sm.step} must be kept but no tier holds a restorable copy with the registered "
            f"bytes: markers {[(t, st) for (s, t), st in states.items() if s == sm.step]}"
        )
    if sm.protected:
        for tier in sm.protected_tiers:
            model.count("check: protected copy not expired")
            state = states.get((sm.step, tier), ("none", None))[0]
            assert state not in GONE, (
                f"step {sm.step} is protected (pinned={sm.pinned}, leases={sorted(sm.leases)}, "
                f"quarantined={sm.quarantined}) but its {tier} copy is {state}"
            )
    for (s, tier), (_, reason) in states.items():
        if s != sm.step or reason is None or tier in sm.tier_quarantined:
            continue
        raise AssertionError(f"step {sm.step}: {tier} quarantined by the store itself: {reason}")


def check_latest(stack: Stack, model: Model, token: str, *, settled: bool) -> None:
    """Latest restorable, read under a lease as a restarting job reads it: the checkpoint offered
    is registered and not quarantined, and every location holds the registered bytes (unless the
    test damaged that copy and the store could not know yet)."""
    for node in (None, model.nodes[0]):
        params: dict[str, Any] = {"lease_ttl": 300, "holder": "sf-check"}
        if node is not None:
            params["node"] = node
        r = stack.api.call("GET", f"/v1/jobs/{model.job}/checkpoints/latest", token, params=params)
        if r.status_code == 404:
            assert code(r) == "no_restorable_checkpoint", r.text
            if settled:
                # A quarantined checkpoint may be kept, but latest never offers it.
                kept = [
                    sm.step
                    for sm in model.registered()
                    if model.must_keep(sm) and not (sm.quarantined or sm.train_quarantined)
                ]
                assert not kept, f"nothing restorable, but steps {kept} must be kept"
            continue
        assert r.status_code == 200, r.text
        body = r.json()
        # Invariant 7: never superseded, never marked bad while quarantined (checked below).
        assert body["checkpoint"]["superseded_by"] is None, body["checkpoint"]
        lease = body.get("lease")
        try:
            _check_plan(stack, model, body)
        finally:
            if lease:
                path = f"/v1/jobs/{model.job}/checkpoints/{body['step']}/leases/{lease['id']}"
                rel = stack.api.call("DELETE", path, token)
                assert rel.status_code == 204, rel.text


def check_known_good(stack: Stack, model: Model, token: str) -> None:
    """latest?health=good answers only a checkpoint the guard certified good, never one it
    later found bad or suspect, never a quarantined one."""
    r = stack.api.call(
        "GET", f"/v1/jobs/{model.job}/checkpoints/latest", token, params={"health": "good"}
    )
    if r.status_code == 404:
        assert code(r) == "no_restorable_checkpoint", r.text
        return
    assert r.status_code == 200, r.text
    sm = model.steps.get(r.json()["step"])
    assert sm is not None and sm.verdict == "good", f"latest?health=good offers {r.json()['step']}"
    assert not (sm.quarantined or sm.train_quarantined), f"offers quarantined step {sm.step}"


def _check_plan(stack: Stack, model: Model, body: dict[str, Any]) -> None:
    step = body["step"]
    sm = model.steps.get(step)
    assert sm is not None, f"latest offers step {step}, which was never registered"
    assert not (sm.quarantined or sm.train_quarantined), f"latest offers quarantined step {step}"
    assert not sm.escaped, (
        f"latest offers step {step}, whose shard is a symlink to another job's file"
    )
    plan = body["plan"]
    assert {e["path"] for e in plan} == set(sm.shards), f"step {step}: plan {plan}"
    for e in plan:
        shard = sm.shards[e["path"]]
        assert e["tier"] not in sm.tier_quarantined, f"latest offers quarantined {e}"
        assert e["crc32c"] == shard.crc and e["size"] == len(shard.data), e
        model.count("check: latest offers registered bytes")
        if (e["tier"], e["path"]) in sm.damage:
            continue
        data = stack.read_location(e["location"])
        assert data == shard.data, (
            f"latest offers step {step} {e['path']!r} from {e['tier']} at {e['location']}: "
            f"{'missing' if data is None else 'bytes differ from the registration'}"
        )


def busy_markers(engine: Engine, model: Model) -> list[str]:
    """Copies still being expired (an expiry runs to its end once begun)."""
    return [
        f"step {s} {t} expiring"
        for (s, t), (state, _) in markers(engine, model.job).items()
        if state == "expiring"
    ]


def forget_repaired(stack: Stack, engine: Engine, model: Model) -> None:
    """Damage the store has mended (a verified replica holding the registered bytes again) is
    no longer excused."""
    for r in replicas(engine, model.job):
        sm = model.steps.get(r.step)
        if sm is None or (r.tier, r.path) not in sm.damage or r.state != "verified":
            continue
        if stack.read_location(r.location) == model.expected(r.step, r.path):
            sm.damage.discard((r.tier, r.path))
            model.count("damage repaired")


def check_confined(engine: Engine, model: Model) -> None:
    """A shard that is a symlink out of its step directory never reaches another tier."""
    for r in replicas(engine, model.job):
        sm = model.steps.get(r.step)
        if sm is None or not sm.escaped or r.tier == LOCAL:
            continue
        model.count("check: symlinked shard confined")
        assert r.state not in ("verified", "expiring", "expired"), (
            f"step {r.step}: the symlinked shard {r.path!r} was copied to {r.tier}"
        )
